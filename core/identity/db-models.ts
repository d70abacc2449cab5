/** Model deployments stored through the admin API, read back for the registry with credentials decrypted. */
import type { ModelEntry } from "../config/schema.ts";
import { decrypt, mapSecrets } from "../secrets.ts";
import type { Db } from "../store/db.ts";
import { proxyModels } from "../store/schema.ts";

/**
 * The stored models, credentials decrypted. One whose credentials the key cannot decrypt (stored
 * under another SVC_SALT_KEY, or, without one, another master key) is left out and reported to
 * `unreadable`: before, the decryption error ("Unsupported state or unable to authenticate data")
 * stopped the gateway from starting, and every reload, naming neither the model nor the cause.
 */
export async function loadDbModels(db: Db, key: Buffer | undefined, unreadable: (model: { id: string; name: string }) => void): Promise<ModelEntry[]> {
  const rows = await db.select().from(proxyModels);
  return rows.flatMap((row) => {
    const params = row.svcParams as Record<string, unknown>;
    let svcParams: Record<string, unknown>;
    try {
      svcParams = key ? mapSecrets(params, (v) => decrypt(v, key)) : params;
    } catch {
      unreadable({ id: row.modelId, name: row.modelName });
      return [];
    }
    return [{ model_name: row.modelName, svc_params: svcParams as ModelEntry["svc_params"], model_info: { ...(row.modelInfo as Record<string, unknown>), id: row.modelId, db_model: true } }];
  });
}
