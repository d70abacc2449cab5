ALTER TABLE "budget_alerts" ADD COLUMN "delivery_id" text;--> statement-breakpoint
ALTER TABLE "budget_alerts" ADD COLUMN "delivered_at" timestamp with time zone;--> statement-breakpoint
ALTER TABLE "budget_alerts" ADD COLUMN "attempts" integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "budget_alerts" ADD COLUMN "next_attempt_at" timestamp with time zone;--> statement-breakpoint
ALTER TABLE "budget_alerts" ADD COLUMN "last_error" text;--> statement-breakpoint
CREATE INDEX "budget_alerts_due_idx" ON "budget_alerts" USING btree ("next_attempt_at") WHERE "budget_alerts"."next_attempt_at" is not null;