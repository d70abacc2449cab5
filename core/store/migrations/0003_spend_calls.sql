CREATE TABLE "spend_calls" (
	"call_id" text PRIMARY KEY NOT NULL
);
