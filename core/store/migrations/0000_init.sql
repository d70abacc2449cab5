CREATE TABLE "gateway_meta" (
	"key" text PRIMARY KEY NOT NULL,
	"value" jsonb NOT NULL,
	"updated_at" timestamp with time zone DEFAULT now()
);
--> statement-breakpoint
CREATE TABLE "proxy_models" (
	"model_id" text PRIMARY KEY NOT NULL,
	"model_name" text NOT NULL,
	"svc_params" jsonb NOT NULL,
	"model_info" jsonb DEFAULT '{}'::jsonb NOT NULL,
	"created_at" timestamp with time zone DEFAULT now(),
	"updated_at" timestamp with time zone DEFAULT now(),
	"created_by" text,
	"updated_by" text
);
--> statement-breakpoint
CREATE INDEX "proxy_models_model_name_idx" ON "proxy_models" USING btree ("model_name");