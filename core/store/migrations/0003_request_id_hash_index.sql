DROP INDEX "spend_logs_request_idx";--> statement-breakpoint
CREATE INDEX "spend_logs_request_idx" ON "spend_logs" USING hash ("request_id");