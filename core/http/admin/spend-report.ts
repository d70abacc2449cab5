/**
 * `/global/spend/report` over the daily aggregates. The store only scans the days asked for (an
 * index range, no grouping or sorting); the rows are summed here (money exactly, as pico-dollar
 * integers) and the JSON is written as text in one pass, so a 30-day report over millions of calls
 * stays far below the cost of building it as objects or in SQL.
 */
import { type SQL, sql } from "drizzle-orm";
import type { Logger } from "../../contract.ts";
import { PICO_PER_USD, picoToText, safePicoToText } from "../../cost/money.ts";
import type { Db } from "../../store/db.ts";
import { teams } from "../../store/schema.ts";
import { rowValues } from "../../store/sql.ts";
import { type Bytes, joinedParts, partBytes, reuseDays } from "./day-cache.ts";
import { quote } from "./json-text.ts";

export interface ReportFilter {
  start: string;
  end: string;
  apiKey?: string;
  teamId?: string;
  customerId?: string;
}

/** A day's `daily_spend` row as the select's columns, in order (arrays: no object per row of thousands). */
type DailyRow = [entityId: string, apiKey: string, modelGroup: string, spendPico: string, input: string | number, output: string | number, requests: string | number, picoseconds: string | null];

/**
 * Spend is summed as a plain number of pico-dollars: exact while below 2^53 (about $9,000 per
 * day and entry). A report whose sums go beyond that is summed again as bigint (see `tree`).
 */
interface Usage {
  spend: number;
  i: number;
  o: number;
  n: number;
  /** Picoseconds of audio (exact at any size); null while no call had any: not an audio model. */
  s: bigint | null;
}

class Overflow extends Error {}

/** Whole pico-dollars as integer text (the store multiplies) → a number, exact below 2^53 (else Overflow). */
function picoNumber(text: string): number {
  const p = Number(text);
  // 2^53 + 1 parses as 2^53: the comparison still catches it.
  if (!(p <= Number.MAX_SAFE_INTEGER && p >= -Number.MAX_SAFE_INTEGER)) throw new Overflow();
  return p;
}

/** A node of the report tree: its totals and its children by id. */
interface Node<C> {
  total: Usage;
  children: Map<string, C>;
}

const usage = (): Usage => ({ spend: 0, i: 0, o: 0, n: 0, s: null });
const node = <C>(): Node<C> => ({ total: usage(), children: new Map() });

function add(u: Usage, spend: number, i: number, o: number, n: number, s: bigint | null): void {
  u.spend += spend;
  if (u.spend > Number.MAX_SAFE_INTEGER) throw new Overflow();
  u.i += i;
  u.o += o;
  u.n += n;
  if (s !== null) u.s = (u.s ?? 0n) + s;
}

/** A row's audio picoseconds: few rows have any, so only those pay for a bigint. */
const picoseconds = (text: string | null): bigint | null => (text === null ? null : BigInt(text));

function child<C>(map: Map<string, C>, id: string, make: () => C): C {
  let c = map.get(id);
  if (!c) {
    c = make();
    map.set(id, c);
  }
  return c;
}

interface Ranked<C> {
  id: string;
  spend: number;
  value: C;
}

const bySpendThenId = (x: { id: string; spend: number }, y: { id: string; spend: number }) => (x.spend === y.spend ? (x.id < y.id ? -1 : 1) : x.spend > y.spend ? -1 : 1);

/** Children by spend, highest first (ties by id, so the order is stable). */
function bySpend<C extends { total: Usage } | Usage>(map: Map<string, C>): [string, C][] {
  const ranked: Ranked<C>[] = [];
  for (const [id, value] of map) ranked.push({ id, spend: "total" in value ? value.total.spend : value.spend, value });
  ranked.sort(bySpendThenId);
  return ranked.map((r) => [r.id, r.value]);
}

/** Amounts with at most 15 significant digits are the ones a double holds exactly as decimals. */
const FIFTEEN_DIGITS = 1e15;

/**
 * The builders' spend sums are whole pico-dollars below 2^53 (see `Overflow`). Below 10^15 (at most
 * 15 significant digits) the quotient of the two exact doubles is written as the shortest text
 * that parses back to it, which is the exact amount (possibly in exponent form, `1.2e-7`): no
 * string work per number. Larger sums are written as their exact decimal text.
 */
const money = (pico: number): number | string => (pico < FIFTEEN_DIGITS ? pico / PICO_PER_USD : safePicoToText(pico));

function whereOf(entityType: string, f: ReportFilter, extra: SQL[]): SQL {
  const where: SQL[] = [sql`d.entity_type = ${entityType}`, sql`d.date between ${f.start}::date and ${f.end}::date`, ...extra];
  if (f.apiKey) where.push(sql`d.api_key = ${f.apiKey}`);
  return sql.join(where, sql` and `);
}

/** The JSON of a day part: bump when it changes, so parts stored by an older version are not served. */
const PART_FORMAT = 5; // 2: keys as JSON; amounts of 16+ significant digits exact (parts stored by 4315e60–92946c1 wrote the nearest double). 3: the day as "group-by-day" too. 4: team_id keeps a key's calls in that team only. 5: an audio model's usage is {cost, seconds, requests}

/**
 * A report day's opening: the day under the spec's name, `group-by-day`, and under LiteLLM's,
 * `group_by_day`, which its clients read.
 */
const dayFields = (day: string): string => `"group-by-day":${quote(day)},"group_by_day":${quote(day)}`;

interface Report {
  db: Db;
  log: Logger;
  entityType: string;
  f: ReportFilter;
  where: SQL;
  /** The report and its filters (not its date range: a day's part is the same in any range), as JSON: an absent filter (null) is not the text "undefined". */
  key: string;
  holdsNames: boolean;
  /** Loads what the parts need besides the rows, once, before the first day is built. */
  prepare?: () => Promise<void>;
  /** A day's part (undefined: none) from its rows. */
  buildDay: (day: string, found: DailyRow[]) => string | undefined;
  /** See DayParts.storeOnly (the prebuild). */
  storeOnly?: boolean;
}

/** `[day parts…]` for the days with rows, oldest first; only changed days are read and built. */
async function report(r: Report): Promise<Blob> {
  const parts = await reuseDays({
    db: r.db,
    log: r.log,
    entityType: r.entityType,
    span: { start: r.f.start, end: r.f.end },
    report: `global-spend-report/${PART_FORMAT}\u0000${r.key}`,
    holdsNames: r.holdsNames,
    storeOnly: r.storeOnly,
    build: async (missing) => {
      await r.prepare?.();
      // A day at a time, the next day's rows asked for while this one is built: hundreds of
      // thousands of rows in one answer would be decoded in one go, holding every other request.
      const rowsOf = async (day: string) =>
        (await rowValues(
          r.db,
          sql`select d.entity_id, d.api_key, d.model_group, (d.spend * 1000000000000)::numeric(30, 0)::text as spend, d.prompt_tokens as i, d.completion_tokens as o, d.api_requests as n,
              (d.audio_seconds * 1000000000000)::numeric(30, 0)::text as s
            from daily_spend d where ${r.where} and d.date = ${day}::date`,
        )) as DailyRow[];
      const out = new Map<string, Bytes>();
      // A read left behind when a day's build throws (a sum past 2^53) must not become an unhandled rejection.
      const ahead = (day: string) => {
        const reading = rowsOf(day);
        reading.catch(() => undefined);
        return reading;
      };
      let next = ahead(missing[0]!);
      for (const [i, day] of missing.entries()) {
        const found = await next;
        if (i + 1 < missing.length) next = ahead(missing[i + 1]!);
        const part = r.buildDay(day, found);
        if (part) out.set(day, partBytes(part));
      }
      return out;
    },
  });
  return joinedParts("[", parts.values(), "]");
}

/** One day's rows: entity → key (or one '' level) → model group. */
function tree(found: DailyRow[], keyOf: (r: DailyRow) => string): Map<string, Node<Node<Usage>>> {
  const entities = new Map<string, Node<Node<Usage>>>();
  for (const r of found) {
    const [entityId, , modelGroup, spendText, input, output, requests, secondsText] = r;
    const spend = picoNumber(spendText);
    const i = Number(input);
    const o = Number(output);
    const n = Number(requests);
    const s = picoseconds(secondsText);
    const entity = child(entities, entityId, node<Node<Usage>>);
    add(entity.total, spend, i, o, n, s);
    const sub = child(entity.children, keyOf(r), node<Usage>);
    add(sub.total, spend, i, o, n, s);
    add(child(sub.children, modelGroup, usage), spend, i, o, n, s);
  }
  return entities;
}

/**
 * A model's entry in a key's `usage`: `{cost, seconds, requests}` for an audio model (its calls
 * were priced by their audio's length), else `{cost, input_tokens, output_tokens, requests}`.
 */
function modelUsageText(u: Usage): string {
  if (u.s !== null) return `{"cost":${money(u.spend)},"seconds":${picoToText(u.s)},"requests":${u.n}}`;
  return `{"cost":${money(u.spend)},"input_tokens":${u.i},"output_tokens":${u.o},"requests":${u.n}}`;
}

/** `[{group-by-day, group_by_day, teams: [{team_name, team_id, spend, keys: [{key, spend, usage: {<model>: modelUsageText}}]}]}]`. */
async function byTeam(db: Db, log: Logger, f: ReportFilter, storeOnly: boolean): Promise<Blob> {
  // Calls of keys without a team are aggregated under team id '' (see spend/flush.ts).
  const where = whereOf("team", f, f.teamId ? [sql`d.entity_id = ${f.teamId}`] : []);
  // Team names are in the parts: they are stamped with the names' version too.
  const aliases = new Map<string, string | null>();
  const prepare = async () => {
    for (const t of await db.select({ id: teams.teamId, alias: teams.teamAlias }).from(teams)) aliases.set(t.id, t.alias);
  };
  const buildDay = (day: string, found: DailyRow[]) => {
    const teamParts: string[] = [];
    for (const [teamId, t] of bySpend(tree(found, (r) => r[1]))) {
      const keyParts: string[] = [];
      for (const [key, k] of bySpend(t.children)) {
        const models = [...k.children].map(([m, u]) => `${quote(m)}:${modelUsageText(u)}`);
        keyParts.push(`{"key":${quote(key)},"spend":${money(k.total.spend)},"usage":{${models.join(",")}}}`);
      }
      const name = aliases.get(teamId) ?? (teamId === "" ? "Unassigned Team" : teamId);
      teamParts.push(`{"team_name":${quote(name)},"team_id":${teamId === "" ? "null" : quote(teamId)},"spend":${money(t.total.spend)},"keys":[${keyParts.join(",")}]}`);
    }
    return teamParts.length ? `{${dayFields(day)},"teams":[${teamParts.join(",")}]}` : undefined;
  };
  return report({ db, log, entityType: "team", f, where, key: JSON.stringify(["team", f.apiKey ?? null, f.teamId ?? null]), holdsNames: true, prepare, buildDay, storeOnly });
}

/** One api key's or customer's day: totals, its first model inline, any further models in `more`. */
interface Entry extends Usage {
  id: string;
  model: string;
  first: Usage;
  more: Map<string, Usage> | undefined;
}

/** One day's entries by spend. Most entries have one model a day, so that one is kept without a map. */
function entriesOf(found: DailyRow[]): Entry[] {
  const entries = new Map<string, Entry>();
  for (const r of found) {
    const [entityId, , modelGroup, spendText, input, output, requests] = r;
    const spend = picoNumber(spendText);
    const i = Number(input);
    const o = Number(output);
    const n = Number(requests);
    const e = entries.get(entityId);
    // These reports' model_details have no seconds (the spec shows them for the team report only).
    if (!e) {
      entries.set(entityId, { id: entityId, spend, i, o, n, s: null, model: modelGroup, first: { spend, i, o, n, s: null }, more: undefined });
      continue;
    }
    add(e, spend, i, o, n, null);
    if (modelGroup === e.model) add(e.first, spend, i, o, n, null);
    else {
      e.more ??= new Map();
      add(child(e.more, modelGroup, usage), spend, i, o, n, null);
    }
  }
  return [...entries.values()].sort(bySpendThenId);
}

/** `[{group-by-day, group_by_day, api_keys|customers: [{api_key|customer, total_cost, total_input_tokens, total_output_tokens, total_requests, model_details: [...]}]}]`. */
async function byDimension(db: Db, log: Logger, f: ReportFilter, dim: "api_key" | "customer", storeOnly: boolean): Promise<Blob> {
  const extra: SQL[] = [];
  if (f.customerId) extra.push(sql`d.entity_id = ${f.customerId}`);
  if (f.teamId) extra.push(sql`d.team_id = ${f.teamId}`);
  const entityType = dim === "api_key" ? "key" : "end_user";
  const where = whereOf(entityType, f, extra);
  const list = dim === "api_key" ? "api_keys" : "customers";
  const model = (m: string, u: Usage) => `{"model":${quote(m)},"total_cost":${money(u.spend)},"total_input_tokens":${u.i},"total_output_tokens":${u.o},"requests":${u.n}}`;
  const buildDay = (day: string, found: DailyRow[]) => {
    const parts: string[] = [];
    for (const e of entriesOf(found)) {
      let models: string;
      if (!e.more) models = model(e.model, e.first);
      else {
        const all = new Map([[e.model, e.first], ...e.more]);
        models = bySpend(all)
          .map(([m, u]) => model(m, u))
          .join(",");
      }
      parts.push(`{"${dim}":${quote(e.id)},"total_cost":${money(e.spend)},"total_input_tokens":${e.i},"total_output_tokens":${e.o},"total_requests":${e.n},"model_details":[${models}]}`);
    }
    return parts.length ? `{${dayFields(day)},"${list}":[${parts.join(",")}]}` : undefined;
  };
  return report({ db, log, entityType, f, where, key: JSON.stringify([dim, f.apiKey ?? null, f.teamId ?? null, f.customerId ?? null]), holdsNames: false, buildDay, storeOnly });
}

/**
 * The report as JSON, or undefined when day parts cannot answer it: a customer filter on another
 * dimension (it needs the customers' rows, not the rows the report groups), or sums too large for
 * the fast path (the caller then builds it exactly with bigint). `storeOnly`: see DayParts (the
 * answer is then empty).
 */
export async function spendReportJson(db: Db, log: Logger, f: ReportFilter, groupBy: "team" | "api_key" | "customer", storeOnly = false): Promise<Blob | undefined> {
  if (f.customerId && groupBy !== "customer") return undefined;
  try {
    return await (groupBy === "team" ? byTeam(db, log, f, storeOnly) : byDimension(db, log, f, groupBy, storeOnly));
  } catch (err) {
    if (err instanceof Overflow) return undefined;
    throw err;
  }
}
