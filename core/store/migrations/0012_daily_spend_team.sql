ALTER TABLE "daily_spend" ADD COLUMN "team_id" text DEFAULT '' NOT NULL;--> statement-breakpoint
-- Rows written before: the team the key spent for last that day (what the reports assumed), one per (day, key), so the key stays unique.
UPDATE "daily_spend" AS d SET "team_id" = kt."team_id"
FROM (
  SELECT DISTINCT ON (t."date", t."api_key") t."date", t."api_key", t."entity_id" AS "team_id" FROM "daily_spend" t
  WHERE t."entity_type" = 'team' AND t."entity_id" <> ''
  ORDER BY t."date", t."api_key", t."updated_at" DESC, t."entity_id" DESC
) AS kt
WHERE d."entity_type" IN ('key', 'user', 'end_user') AND kt."date" = d."date" AND kt."api_key" = d."api_key";--> statement-breakpoint
ALTER TABLE "daily_spend" DROP CONSTRAINT "daily_spend_entity_type_entity_id_date_api_key_model_model_group_provider_pk";--> statement-breakpoint
ALTER TABLE "daily_spend" ADD CONSTRAINT "daily_spend_entity_type_entity_id_date_api_key_model_model_group_provider_team_id_pk" PRIMARY KEY("entity_type","entity_id","date","api_key","model","model_group","provider","team_id");
