/** Model deployments stored through the admin API, read back for the registry with credentials decrypted. */
import type { ModelEntry } from "../config/schema.ts";
import { decrypt, mapSecrets } from "../secrets.ts";
import type { Db } from "../store/db.ts";
import { proxyModels } from "../store/schema.ts";

export async function loadDbModels(db: Db, key: Buffer | undefined): Promise<ModelEntry[]> {
  const rows = await db.select().from(proxyModels);
  return rows.map((row) => {
    const params = row.svcParams as Record<string, unknown>;
    return {
      model_name: row.modelName,
      svc_params: (key ? mapSecrets(params, (v) => decrypt(v, key)) : params) as ModelEntry["svc_params"],
      model_info: { ...(row.modelInfo as Record<string, unknown>), id: row.modelId, db_model: true },
    };
  });
}
