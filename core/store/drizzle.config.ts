// drizzle-kit config; paths are relative to the repo root, where drizzle-kit is run:
//   bunx drizzle-kit generate --config core/store/drizzle.config.ts --name <x>
import { defineConfig } from "drizzle-kit";

export default defineConfig({
  dialect: "postgresql",
  schema: "./core/store/schema.ts",
  out: "./core/store/migrations",
});
