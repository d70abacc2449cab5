/** Model deployments stored through the admin API, read back for the registry with credentials decrypted. */
import type { ModelEntry } from "../config/schema.ts";
import { decryptSecrets } from "../secrets.ts";
import type { Db } from "../store/db.ts";
import { proxyModels } from "../store/schema.ts";

/**
 * The stored models, credentials decrypted; those whose credentials the key cannot decrypt (stored
 * under another SVC_SALT_KEY, or, without one, another master key) apart, by id and name: before,
 * the decryption error ("Unsupported state or unable to authenticate data") was all the gateway
 * said, naming neither the model nor the cause (the registry build decides what follows).
 */
export async function loadDbModels(db: Db, key: Buffer | undefined): Promise<StoredModels> {
  const rows = await db.select().from(proxyModels);
  const out: StoredModels = { entries: [], unreadable: [] };
  for (const row of rows) {
    const params = row.svcParams as Record<string, unknown>;
    let svcParams: Record<string, unknown>;
    try {
      svcParams = key ? decryptSecrets(params, key) : params;
    } catch {
      out.unreadable.push({ id: row.modelId, name: row.modelName });
      continue;
    }
    const info = { ...(row.modelInfo as Record<string, unknown>), id: row.modelId, db_model: true };
    out.entries.push({ model_name: row.modelName, svc_params: svcParams as ModelEntry["svc_params"], model_info: info as ModelEntry["model_info"] });
  }
  return out;
}

export interface StoredModels {
  entries: ModelEntry[];
  /** Models whose credentials the key cannot decrypt. */
  unreadable: { id: string; name: string }[];
}
