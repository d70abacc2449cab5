CREATE TABLE "budget_alerts" (
	"counter_id" text NOT NULL,
	"event" text NOT NULL,
	"period" text NOT NULL,
	"sent_at" timestamp with time zone DEFAULT now() NOT NULL,
	"payload" jsonb NOT NULL,
	CONSTRAINT "budget_alerts_counter_id_event_period_pk" PRIMARY KEY("counter_id","event","period")
);
--> statement-breakpoint
CREATE TABLE "daily_spend" (
	"entity_type" text NOT NULL,
	"entity_id" text NOT NULL,
	"date" date NOT NULL,
	"api_key" text DEFAULT '' NOT NULL,
	"model" text DEFAULT '' NOT NULL,
	"model_group" text DEFAULT '' NOT NULL,
	"provider" text DEFAULT '' NOT NULL,
	"prompt_tokens" bigint DEFAULT 0 NOT NULL,
	"completion_tokens" bigint DEFAULT 0 NOT NULL,
	"cache_read_input_tokens" bigint DEFAULT 0 NOT NULL,
	"cache_creation_input_tokens" bigint DEFAULT 0 NOT NULL,
	"spend" numeric(30, 12) DEFAULT '0' NOT NULL,
	"api_requests" bigint DEFAULT 0 NOT NULL,
	"successful_requests" bigint DEFAULT 0 NOT NULL,
	"failed_requests" bigint DEFAULT 0 NOT NULL,
	"updated_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "daily_spend_entity_type_entity_id_date_api_key_model_model_group_provider_pk" PRIMARY KEY("entity_type","entity_id","date","api_key","model","model_group","provider")
);
--> statement-breakpoint
CREATE TABLE "spend_logs" (
	"call_id" text PRIMARY KEY NOT NULL,
	"request_id" text NOT NULL,
	"call_type" text NOT NULL,
	"api_key" text NOT NULL,
	"key_alias" text,
	"user_id" text,
	"team_id" text,
	"organization_id" text,
	"end_user" text,
	"model" text NOT NULL,
	"model_group" text NOT NULL,
	"provider" text NOT NULL,
	"model_id" text NOT NULL,
	"upstream_model" text NOT NULL,
	"spend" numeric(30, 12) NOT NULL,
	"prompt_tokens" integer DEFAULT 0 NOT NULL,
	"completion_tokens" integer DEFAULT 0 NOT NULL,
	"total_tokens" integer DEFAULT 0 NOT NULL,
	"cache_read_input_tokens" integer DEFAULT 0 NOT NULL,
	"cache_creation_input_tokens" integer DEFAULT 0 NOT NULL,
	"reasoning_tokens" integer DEFAULT 0 NOT NULL,
	"start_time" timestamp with time zone NOT NULL,
	"end_time" timestamp with time zone NOT NULL,
	"completion_start_time" timestamp with time zone,
	"status" text NOT NULL,
	"stream" boolean DEFAULT false NOT NULL,
	"cache_hit" boolean DEFAULT false NOT NULL,
	"request_tags" text[] DEFAULT '{}'::text[] NOT NULL,
	"metadata" jsonb DEFAULT '{}'::jsonb NOT NULL
);
--> statement-breakpoint
CREATE INDEX "daily_spend_date_idx" ON "daily_spend" USING btree ("entity_type","date");--> statement-breakpoint
CREATE INDEX "spend_logs_start_idx" ON "spend_logs" USING btree ("start_time");--> statement-breakpoint
CREATE INDEX "spend_logs_key_start_idx" ON "spend_logs" USING btree ("api_key","start_time");--> statement-breakpoint
CREATE INDEX "spend_logs_request_idx" ON "spend_logs" USING btree ("request_id");--> statement-breakpoint
CREATE INDEX "virtual_keys_reset_idx" ON "virtual_keys" USING btree ("budget_reset_at");