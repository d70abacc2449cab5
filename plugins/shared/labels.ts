/** How limit and budget messages name whose limit was reached. */
import type { Principal } from "../../core/contract.ts";

export function keyLabel(p: Principal): string {
  const name = p.key?.keyName ?? p.keyHash.slice(0, 8);
  return p.keyAlias ? `Key ${name} (alias ${p.keyAlias})` : `Key ${name}`;
}
