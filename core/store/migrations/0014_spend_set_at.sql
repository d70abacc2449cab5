ALTER TABLE "team_members" ADD COLUMN "spend_set_at" timestamp with time zone;--> statement-breakpoint
ALTER TABLE "teams" ADD COLUMN "spend_set_at" timestamp with time zone;--> statement-breakpoint
ALTER TABLE "users" ADD COLUMN "spend_set_at" timestamp with time zone;--> statement-breakpoint
ALTER TABLE "virtual_keys" ADD COLUMN "spend_set_at" timestamp with time zone;