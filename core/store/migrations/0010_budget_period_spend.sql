CREATE TABLE "budget_period_spend" (
	"counter" text NOT NULL,
	"period_end" timestamp with time zone NOT NULL,
	"spend" numeric(30, 12) DEFAULT '0' NOT NULL,
	CONSTRAINT "budget_period_spend_counter_period_end_pk" PRIMARY KEY("counter","period_end")
);
--> statement-breakpoint
CREATE INDEX "budget_period_spend_end_idx" ON "budget_period_spend" USING btree ("period_end");