ALTER TABLE "daily_spend" ADD COLUMN "audio_seconds" numeric(30, 12);--> statement-breakpoint
ALTER TABLE "spend_logs" ADD COLUMN "audio_seconds" numeric(30, 12);