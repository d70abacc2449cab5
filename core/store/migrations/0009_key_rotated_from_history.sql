DROP INDEX "virtual_keys_rotated_from_idx";--> statement-breakpoint
ALTER TABLE "virtual_keys" ALTER COLUMN "rotated_from" SET DATA TYPE text[] USING (CASE WHEN "rotated_from" IS NULL THEN '{}'::text[] ELSE ARRAY["rotated_from"] END);--> statement-breakpoint
ALTER TABLE "virtual_keys" ALTER COLUMN "rotated_from" SET DEFAULT '{}'::text[];--> statement-breakpoint
ALTER TABLE "virtual_keys" ALTER COLUMN "rotated_from" SET NOT NULL;--> statement-breakpoint
CREATE INDEX "virtual_keys_rotated_from_idx" ON "virtual_keys" USING gin ("rotated_from");
