ALTER TABLE "virtual_keys" ADD COLUMN "first_token" text;--> statement-breakpoint
CREATE UNIQUE INDEX "virtual_keys_first_token_idx" ON "virtual_keys" USING btree ("first_token");