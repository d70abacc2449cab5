CREATE TABLE "report_names" (
	"id" integer PRIMARY KEY NOT NULL,
	"version" bigint DEFAULT 1 NOT NULL
);
--> statement-breakpoint
CREATE TABLE "report_parts" (
	"report" text NOT NULL,
	"day" date NOT NULL,
	"stamp" text NOT NULL,
	"body" text NOT NULL,
	"stored_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "report_parts_report_day_pk" PRIMARY KEY("report","day")
);
--> statement-breakpoint
-- Parts are megabytes of JSON read whole: stored uncompressed, a restart reads them at disk speed.
ALTER TABLE "report_parts" ALTER COLUMN "body" SET STORAGE EXTERNAL;
--> statement-breakpoint
INSERT INTO "report_names" ("id", "version") VALUES (1, 1);
--> statement-breakpoint
CREATE FUNCTION "report_names_bump"() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  UPDATE "report_names" SET "version" = "version" + 1 WHERE "id" = 1;
  RETURN NULL;
END $$;
--> statement-breakpoint
-- A new key, team or org has spent nothing, so its insert changes no part, unless its id has spend
-- already (a key re-created with the value of a rotated-away one): then its names are new in parts.
-- Arguments: the daily_spend entity type and the id column of the inserted rows.
CREATE FUNCTION "report_names_bump_if_spent"() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM added a JOIN "daily_spend" d ON d."entity_type" = TG_ARGV[0] AND d."entity_id" = to_jsonb(a) ->> TG_ARGV[1]) THEN
    UPDATE "report_names" SET "version" = "version" + 1 WHERE "id" = 1;
  END IF;
  RETURN NULL;
END $$;
--> statement-breakpoint
-- The spend writer's updates of a key (spend, last use) name none of these columns and do not fire this.
CREATE TRIGGER "report_names_on_keys" AFTER DELETE OR UPDATE OF "token", "key_alias", "team_id" ON "virtual_keys" FOR EACH STATEMENT EXECUTE FUNCTION "report_names_bump"();
--> statement-breakpoint
CREATE TRIGGER "report_names_on_new_keys" AFTER INSERT ON "virtual_keys" REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION "report_names_bump_if_spent"('key', 'token');
--> statement-breakpoint
CREATE TRIGGER "report_names_on_teams" AFTER DELETE OR UPDATE OF "team_id", "team_alias" ON "teams" FOR EACH STATEMENT EXECUTE FUNCTION "report_names_bump"();
--> statement-breakpoint
CREATE TRIGGER "report_names_on_new_teams" AFTER INSERT ON "teams" REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION "report_names_bump_if_spent"('team', 'team_id');
--> statement-breakpoint
CREATE TRIGGER "report_names_on_orgs" AFTER DELETE OR UPDATE OF "organization_id", "organization_alias" ON "organizations" FOR EACH STATEMENT EXECUTE FUNCTION "report_names_bump"();
--> statement-breakpoint
CREATE TRIGGER "report_names_on_new_orgs" AFTER INSERT ON "organizations" REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION "report_names_bump_if_spent"('org', 'organization_id');
