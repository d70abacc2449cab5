-- Cancelled calls (the client left) were counted in api_requests but in neither successful_requests nor failed_requests: they count as failed now.
UPDATE "daily_spend" SET "failed_requests" = "api_requests" - "successful_requests" WHERE "failed_requests" <> "api_requests" - "successful_requests";
