CREATE TABLE "daily_spend_days" (
	"entity_type" text NOT NULL,
	"date" date NOT NULL,
	"version" bigint DEFAULT 1 NOT NULL,
	CONSTRAINT "daily_spend_days_entity_type_date_pk" PRIMARY KEY("entity_type","date")
);
--> statement-breakpoint
CREATE FUNCTION "daily_spend_days_bump"() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  -- In key order, so two writers that touch the same days lock their versions in the same order.
  INSERT INTO "daily_spend_days" AS v ("entity_type", "date")
  SELECT DISTINCT "entity_type", "date" FROM changed ORDER BY 1, 2
  ON CONFLICT ("entity_type", "date") DO UPDATE SET "version" = v."version" + 1;
  RETURN NULL;
END $$;
--> statement-breakpoint
CREATE TRIGGER "daily_spend_days_on_insert" AFTER INSERT ON "daily_spend" REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION "daily_spend_days_bump"();
--> statement-breakpoint
CREATE TRIGGER "daily_spend_days_on_update" AFTER UPDATE ON "daily_spend" REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION "daily_spend_days_bump"();
--> statement-breakpoint
CREATE TRIGGER "daily_spend_days_on_delete" AFTER DELETE ON "daily_spend" REFERENCING OLD TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION "daily_spend_days_bump"();
--> statement-breakpoint
INSERT INTO "daily_spend_days" ("entity_type", "date") SELECT DISTINCT "entity_type", "date" FROM "daily_spend" ON CONFLICT DO NOTHING;
