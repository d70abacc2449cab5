CREATE TABLE "access_groups" (
	"access_group_id" text PRIMARY KEY NOT NULL,
	"access_group_name" text NOT NULL,
	"model_names" text[] DEFAULT '{}'::text[] NOT NULL,
	"description" text,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	"created_by" text,
	"updated_at" timestamp with time zone DEFAULT now() NOT NULL,
	"updated_by" text,
	CONSTRAINT "access_groups_access_group_name_unique" UNIQUE("access_group_name")
);
--> statement-breakpoint
CREATE TABLE "audit_log" (
	"id" text PRIMARY KEY NOT NULL,
	"at" timestamp with time zone DEFAULT now() NOT NULL,
	"changed_by" text,
	"changed_by_api_key" text,
	"action" text NOT NULL,
	"table_name" text NOT NULL,
	"object_id" text NOT NULL,
	"before_value" jsonb,
	"updated_values" jsonb
);
--> statement-breakpoint
CREATE TABLE "budgets" (
	"budget_id" text PRIMARY KEY NOT NULL,
	"spend" numeric(30, 12) DEFAULT '0' NOT NULL,
	"max_budget" numeric(30, 12),
	"soft_budget" numeric(30, 12),
	"budget_duration" text,
	"budget_reset_at" timestamp with time zone,
	"model_max_budget" jsonb,
	"tpm_limit" bigint,
	"rpm_limit" bigint,
	"max_parallel_requests" integer,
	"model_tpm_limit" jsonb,
	"model_rpm_limit" jsonb,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	"created_by" text,
	"updated_at" timestamp with time zone DEFAULT now() NOT NULL,
	"updated_by" text
);
--> statement-breakpoint
CREATE TABLE "org_members" (
	"organization_id" text NOT NULL,
	"user_id" text NOT NULL,
	"user_role" text DEFAULT 'internal_user' NOT NULL,
	"spend" numeric(30, 12) DEFAULT '0' NOT NULL,
	"max_budget_in_organization" numeric(30, 12),
	"budget_id" text,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	"updated_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "org_members_organization_id_user_id_pk" PRIMARY KEY("organization_id","user_id")
);
--> statement-breakpoint
CREATE TABLE "organizations" (
	"organization_id" text PRIMARY KEY NOT NULL,
	"organization_alias" text,
	"budget_id" text,
	"models" text[] DEFAULT '{}'::text[] NOT NULL,
	"spend" numeric(30, 12) DEFAULT '0' NOT NULL,
	"max_budget" numeric(30, 12),
	"soft_budget" numeric(30, 12),
	"budget_duration" text,
	"budget_reset_at" timestamp with time zone,
	"model_max_budget" jsonb,
	"tpm_limit" bigint,
	"rpm_limit" bigint,
	"max_parallel_requests" integer,
	"model_tpm_limit" jsonb,
	"model_rpm_limit" jsonb,
	"blocked" boolean DEFAULT false NOT NULL,
	"metadata" jsonb DEFAULT '{}'::jsonb NOT NULL,
	"tags" text[] DEFAULT '{}'::text[] NOT NULL,
	"model_aliases" jsonb DEFAULT '{}'::jsonb NOT NULL,
	"object_permission" jsonb,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	"created_by" text,
	"updated_at" timestamp with time zone DEFAULT now() NOT NULL,
	"updated_by" text
);
--> statement-breakpoint
CREATE TABLE "rotated_keys" (
	"token" text PRIMARY KEY NOT NULL,
	"active_token" text NOT NULL,
	"revoke_at" timestamp with time zone NOT NULL,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL
);
--> statement-breakpoint
CREATE TABLE "team_members" (
	"team_id" text NOT NULL,
	"user_id" text NOT NULL,
	"role" text DEFAULT 'user' NOT NULL,
	"spend" numeric(30, 12) DEFAULT '0' NOT NULL,
	"max_budget_in_team" numeric(30, 12),
	"tpm_limit" bigint,
	"rpm_limit" bigint,
	"budget_id" text,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "team_members_team_id_user_id_pk" PRIMARY KEY("team_id","user_id")
);
--> statement-breakpoint
CREATE TABLE "teams" (
	"team_id" text PRIMARY KEY NOT NULL,
	"team_alias" text,
	"organization_id" text,
	"budget_id" text,
	"models" text[] DEFAULT '{}'::text[] NOT NULL,
	"spend" numeric(30, 12) DEFAULT '0' NOT NULL,
	"max_budget" numeric(30, 12),
	"soft_budget" numeric(30, 12),
	"budget_duration" text,
	"budget_reset_at" timestamp with time zone,
	"model_max_budget" jsonb,
	"tpm_limit" bigint,
	"rpm_limit" bigint,
	"max_parallel_requests" integer,
	"model_tpm_limit" jsonb,
	"model_rpm_limit" jsonb,
	"blocked" boolean DEFAULT false NOT NULL,
	"metadata" jsonb DEFAULT '{}'::jsonb NOT NULL,
	"tags" text[] DEFAULT '{}'::text[] NOT NULL,
	"model_aliases" jsonb DEFAULT '{}'::jsonb NOT NULL,
	"access_group_ids" text[] DEFAULT '{}'::text[] NOT NULL,
	"team_member_permissions" text[] DEFAULT '{}'::text[] NOT NULL,
	"object_permission" jsonb,
	"callback_settings" jsonb,
	"guardrails" text[] DEFAULT '{}'::text[] NOT NULL,
	"policies" text[] DEFAULT '{}'::text[] NOT NULL,
	"prompts" text[] DEFAULT '{}'::text[] NOT NULL,
	"router_settings" jsonb,
	"allowed_passthrough_routes" text[] DEFAULT '{}'::text[] NOT NULL,
	"allowed_vector_store_indexes" jsonb,
	"member_settings" jsonb DEFAULT '{}'::jsonb NOT NULL,
	"deleted_at" timestamp with time zone,
	"deleted_by" text,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	"created_by" text,
	"updated_at" timestamp with time zone DEFAULT now() NOT NULL,
	"updated_by" text
);
--> statement-breakpoint
CREATE TABLE "users" (
	"user_id" text PRIMARY KEY NOT NULL,
	"user_email" text,
	"user_alias" text,
	"user_role" text DEFAULT 'internal_user' NOT NULL,
	"organization_id" text,
	"models" text[] DEFAULT '{}'::text[] NOT NULL,
	"spend" numeric(30, 12) DEFAULT '0' NOT NULL,
	"max_budget" numeric(30, 12),
	"soft_budget" numeric(30, 12),
	"budget_duration" text,
	"budget_reset_at" timestamp with time zone,
	"model_max_budget" jsonb,
	"tpm_limit" bigint,
	"rpm_limit" bigint,
	"max_parallel_requests" integer,
	"model_tpm_limit" jsonb,
	"model_rpm_limit" jsonb,
	"metadata" jsonb DEFAULT '{}'::jsonb NOT NULL,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	"created_by" text,
	"updated_at" timestamp with time zone DEFAULT now() NOT NULL,
	"updated_by" text
);
--> statement-breakpoint
CREATE TABLE "virtual_keys" (
	"token" text PRIMARY KEY NOT NULL,
	"key_name" text NOT NULL,
	"key_alias" text,
	"key_type" text DEFAULT 'default' NOT NULL,
	"user_id" text,
	"team_id" text,
	"organization_id" text,
	"agent_id" text,
	"budget_id" text,
	"service_account_id" text,
	"models" text[] DEFAULT '{}'::text[] NOT NULL,
	"tags" text[] DEFAULT '{}'::text[] NOT NULL,
	"prompts" text[] DEFAULT '{}'::text[] NOT NULL,
	"enforced_params" text[] DEFAULT '{}'::text[] NOT NULL,
	"spend" numeric(30, 12) DEFAULT '0' NOT NULL,
	"max_budget" numeric(30, 12),
	"soft_budget" numeric(30, 12),
	"budget_duration" text,
	"budget_reset_at" timestamp with time zone,
	"model_max_budget" jsonb,
	"tpm_limit" bigint,
	"rpm_limit" bigint,
	"max_parallel_requests" integer,
	"model_tpm_limit" jsonb,
	"model_rpm_limit" jsonb,
	"tpm_limit_type" text,
	"rpm_limit_type" text,
	"metadata" jsonb DEFAULT '{}'::jsonb NOT NULL,
	"allowed_cache_controls" text[] DEFAULT '{}'::text[] NOT NULL,
	"expires" timestamp with time zone,
	"permissions" jsonb DEFAULT '{}'::jsonb NOT NULL,
	"guardrails" text[] DEFAULT '{}'::text[] NOT NULL,
	"policies" text[] DEFAULT '{}'::text[] NOT NULL,
	"disable_global_guardrails" boolean DEFAULT false NOT NULL,
	"blocked" boolean DEFAULT false NOT NULL,
	"aliases" jsonb DEFAULT '{}'::jsonb NOT NULL,
	"config" jsonb DEFAULT '{}'::jsonb NOT NULL,
	"temp_budget_increase" numeric(30, 12),
	"temp_budget_expiry" timestamp with time zone,
	"allowed_routes" text[] DEFAULT '{}'::text[] NOT NULL,
	"allowed_passthrough_routes" text[] DEFAULT '{}'::text[] NOT NULL,
	"object_permission" jsonb,
	"auto_rotate" boolean DEFAULT false NOT NULL,
	"rotation_interval" text,
	"key_rotation_at" timestamp with time zone,
	"last_rotation_at" timestamp with time zone,
	"rotation_count" integer DEFAULT 0 NOT NULL,
	"allowed_vector_store_indexes" jsonb,
	"router_settings" jsonb,
	"access_group_ids" text[] DEFAULT '{}'::text[] NOT NULL,
	"last_active" timestamp with time zone,
	"deleted_at" timestamp with time zone,
	"deleted_by" text,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	"created_by" text,
	"updated_at" timestamp with time zone DEFAULT now() NOT NULL,
	"updated_by" text
);
--> statement-breakpoint
CREATE INDEX "audit_log_at_idx" ON "audit_log" USING btree ("at");--> statement-breakpoint
CREATE INDEX "audit_log_object_idx" ON "audit_log" USING btree ("table_name","object_id");--> statement-breakpoint
CREATE INDEX "org_members_user_idx" ON "org_members" USING btree ("user_id");--> statement-breakpoint
CREATE INDEX "team_members_user_idx" ON "team_members" USING btree ("user_id");--> statement-breakpoint
CREATE INDEX "teams_org_idx" ON "teams" USING btree ("organization_id");--> statement-breakpoint
CREATE INDEX "users_email_idx" ON "users" USING btree ("user_email");--> statement-breakpoint
CREATE UNIQUE INDEX "virtual_keys_alias_live_idx" ON "virtual_keys" USING btree ("key_alias") WHERE "virtual_keys"."deleted_at" is null;--> statement-breakpoint
CREATE INDEX "virtual_keys_team_idx" ON "virtual_keys" USING btree ("team_id");--> statement-breakpoint
CREATE INDEX "virtual_keys_user_idx" ON "virtual_keys" USING btree ("user_id");