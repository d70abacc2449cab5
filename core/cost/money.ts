/**
 * Exact money. Amounts are bigint pico-dollars (1e-12 USD): the scale of the store's
 * `numeric(30,12)` columns, so a sum in memory and a sum in SQL agree to the last digit. Unit
 * prices (per token, per pixel) are finer than that, so they are kept in yocto-dollars (1e-24 USD)
 * and a cost is rounded to pico-dollars once, after the sum.
 */

const MAX_EXACT_PICO = BigInt(Number.MAX_SAFE_INTEGER);

/** An amount of money: bigint pico-dollars (1e-12 USD). */
export type Pico = bigint;
/** A unit price: bigint yocto-dollars (1e-24 USD) per unit. */
export type Rate = bigint;

export const PICO_DIGITS = 12;
const RATE_DIGITS = 24;
const PICO_PER_RATE = 10n ** BigInt(RATE_DIGITS - PICO_DIGITS);

const DECIMAL = /^([+-]?)(\d*)(?:\.(\d*))?(?:[eE]([+-]?\d+))?$/;

/** A decimal (number or text, exponent form too) as an integer count of 10^-digits, rounded half up. */
export function scaled(value: number | string, digits: number): bigint {
  const text = typeof value === "number" ? numberText(value) : value.trim();
  const m = DECIMAL.exec(text);
  if (!m || (m[2] === "" && (m[3] ?? "") === "")) throw new RangeError(`not a decimal number: ${JSON.stringify(value)}`);
  const [, sign, int = "", frac = "", exp = "0"] = m;
  const digitsText = `${int}${frac}`.replace(/^0+/, "") || "0";
  // value = digitsText × 10^(exp - frac.length); we want value × 10^digits.
  const shift = Number(exp) - frac.length + digits;
  let n: bigint;
  if (shift >= 0) n = BigInt(digitsText) * 10n ** BigInt(shift);
  else {
    const div = 10n ** BigInt(-shift);
    const whole = BigInt(digitsText);
    n = whole / div + ((whole % div) * 2n >= div ? 1n : 0n);
  }
  return sign === "-" ? -n : n;
}

function numberText(v: number): string {
  if (!Number.isFinite(v)) throw new RangeError(`not a finite number: ${v}`);
  // Shortest round-trip text: 2.5e-6 stays 2.5e-6 rather than 0.0000025000000000000002.
  return String(v);
}

export function usdToPico(value: number | string): Pico {
  return scaled(value, PICO_DIGITS);
}

export function rate(value: number | string): Rate {
  return scaled(value, RATE_DIGITS);
}

/** Yocto-dollars → pico-dollars, rounded half up (costs are never negative). */
export function rateToPico(amount: bigint): Pico {
  return amount / PICO_PER_RATE + ((amount % PICO_PER_RATE) * 2n >= PICO_PER_RATE ? 1n : 0n);
}

export const PICO_PER_USD = 1e12;

/**
 * Pico-dollars in plain JSON (which has no bigint): a number while one holds them exactly (below
 * 2^53, about $9,007: nearly every call, and cheap), else the integer's decimal text.
 */
export type PicoJson = number | string;

export function picoJson(p: Pico): PicoJson {
  return p <= MAX_EXACT_PICO && p >= -MAX_EXACT_PICO ? Number(p) : p.toString();
}

/** Exact decimal text of an amount in USD, without trailing zeros ("0.000125", "12", "0"). */
export function picoToText(p: Pico): string {
  // Below 2^53 plain number arithmetic is exact and several times faster than bigint division.
  return p <= MAX_EXACT_PICO && p >= 0n ? safePicoToText(Number(p)) : bigPicoToText(p);
}

/** `picoToText` of a whole, non-negative number of pico-dollars below 2^53 (exact as a number). */
export function safePicoToText(n: number): string {
  let int = Math.floor(n / PICO_PER_USD);
  let frac = n - int * PICO_PER_USD;
  if (frac < 0) {
    int -= 1;
    frac += PICO_PER_USD;
  } else if (frac >= PICO_PER_USD) {
    int += 1;
    frac -= PICO_PER_USD;
  }
  if (frac === 0) return String(int);
  let digits = String(frac).padStart(PICO_DIGITS, "0");
  let end = digits.length;
  while (digits.charCodeAt(end - 1) === 48 /* 0 */) end--;
  digits = digits.slice(0, end);
  return `${int}.${digits}`;
}

function bigPicoToText(p: Pico): string {
  const negative = p < 0n;
  const abs = negative ? -p : p;
  const int = abs / 10n ** BigInt(PICO_DIGITS);
  const frac = (abs % 10n ** BigInt(PICO_DIGITS)).toString().padStart(PICO_DIGITS, "0").replace(/0+$/, "");
  return `${negative ? "-" : ""}${int}${frac ? `.${frac}` : ""}`;
}


/**
 * For JSON answers that promise exact amounts (spend reports): the amount as a JSON number written
 * with its exact decimal text, where a plain number would be the nearest double (from $8,192 up, a
 * double cannot hold every 12-decimal amount). `JSON.stringify` writes it as it is.
 */
export function exactUsdJson(p: Pico): unknown {
  return (JSON as JSON & { rawJSON(text: string): unknown }).rawJSON(picoToText(p));
}

/** `exactUsdJson` of a `numeric` column value (its text). */
export function exactColumnJson(v: string): unknown {
  return exactUsdJson(columnToPico(v));
}

/**
 * For JSON responses (the spec's `float` fields); exact values stay in the store. Below 2^53 the
 * division of two exact doubles is correctly rounded, so it gives the same double as parsing the
 * exact decimal text, without building the text.
 */
export function picoToUsd(p: Pico): number {
  if (p <= MAX_EXACT_PICO && p >= -MAX_EXACT_PICO) return Number(p) / PICO_PER_USD;
  return Number(picoToText(p));
}

/** A `numeric` column value (text) → pico-dollars; null and empty mean 0. */
export function columnToPico(v: string | number | null | undefined): Pico {
  if (v === null || v === undefined || v === "") return 0n;
  // The store's own text for numeric(30,12) values and their sums: digits, a point, 12 digits.
  if (typeof v === "string" && v.length > 13 && v.charCodeAt(v.length - 13) === 46 /* . */ && v.charCodeAt(0) !== 45 /* - */) {
    return BigInt(v.slice(0, -13) + v.slice(-12));
  }
  return usdToPico(v);
}
