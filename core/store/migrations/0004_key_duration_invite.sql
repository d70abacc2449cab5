ALTER TABLE "virtual_keys" ADD COLUMN "duration" text;--> statement-breakpoint
ALTER TABLE "virtual_keys" ADD COLUMN "send_invite_email" boolean DEFAULT false NOT NULL;