/**
 * Proxies an upstream stream to the client as OpenAI SSE. Pull-based: each client pull reads one
 * upstream chunk, so the client's pace drives upstream reads (backpressure); a client that leaves
 * aborts the upstream call; usage is known at the end (or estimated on cancel) before the call is
 * recorded. Framing is parsed synchronously in the pull (no stream-per-stage chain), and every
 * event of one upstream read goes out in one write.
 */
import type { CallStatus, Deployment, ErrorInfo, ProviderAdapter, StreamTransform, Usage, WireRequest } from "../contract.ts";
import { errorBody, errorInfo, GatewayError } from "../errors.ts";
import { withoutCredentials } from "../secrets.ts";
import { AwsEventStreamParser } from "../stream/aws-eventstream.ts";
import { type EventParser, NdjsonParser, SseParser } from "../stream/framing.ts";
import { promptSize } from "../cost/estimate.ts";
import { answerTokenBound } from "../cost/worst-case.ts";
import { chatCompletionId, nowSeconds } from "../openai-ids.ts";
import { openAIUsage } from "../openai-usage.ts";
import { type Deadline, streamErrorOf, timeoutError } from "./upstream.ts";

const DONE = "data: [DONE]\n\n";
/**
 * Bun sends a response's status and headers with its first bytes. When the model is slow to its
 * first event (a reasoning model, a long prompt), this SSE comment, which clients skip, sends them
 * (the call id among them) instead of leaving the client with nothing.
 */
const WAITING = ": waiting for the model\n\n";
const WAITING_AFTER_MS = 1000;
/** The most of an SSE body's text kept before its first event, for a body that is JSON instead (see endOfBody). */
const MAX_UNFRAMED_CHARS = 64 * 1024;
/** Settles after any already-settled promise raced against it. */
const NOT_READY = Symbol("not ready");

/** Whether `p` has already settled (a rejection counts: the next await of it will throw). */
async function settled(p: Promise<unknown>): Promise<boolean> {
  try {
    return (await Promise.race([p, NOT_READY])) !== NOT_READY;
  } catch {
    return true;
  }
}

export interface StreamArgs {
  res: Response;
  /** Reads the stream's error events as it reads error answers (streamErrorOf). */
  adapter: ProviderAdapter;
  deployment: Deployment;
  transform: StreamTransform<"chat" | "completions", unknown>;
  endpoint: "chat" | "completions";
  request: WireRequest["chat" | "completions"];
  deadline: Deadline;
  headers: Record<string, string>;
  /** `billed`: whether a failure is charged its usage (see callDeployment's finish). */
  finish(status: CallStatus, usage: Usage, error?: ErrorInfo, firstByteAt?: number, responseId?: string, billed?: boolean): unknown;
  /** Sees every piece of text sent to the client (the response cache keeps a stream this way). */
  tap?(text: string): void;
}

/** Whether an event's data is whole: every provider's events are JSON, or OpenAI's `[DONE]`. */
function isWholeEvent(data: string): boolean {
  if (data === "[DONE]") return true;
  try {
    JSON.parse(data);
    return true;
  } catch {
    return false;
  }
}

/**
 * One SSE event of a chunk's JSON. An upstream may spread an event over several `data:` lines,
 * which the parser joins with "\n"; a line break in JSON can only be whitespace between tokens, so
 * it goes out as a space: one `data:` line per event, as OpenAI sends, and what clients that read
 * a line at a time (and the stored answer's assembly) expect.
 */
function sseEvent(json: string): string {
  return `data: ${json.includes("\n") ? json.replaceAll("\n", " ") : json}\n\n`;
}

/** An error in the stream, ending it: the client gets it as one last SSE event. */
class StreamFailure {
  constructor(readonly error: ErrorInfo) {}
}

export async function streamResponse(a: StreamArgs): Promise<Response> {
  const { transform, deadline, deployment: d } = a;
  const state = transform.init(a.request as never);
  const reader = a.res.body!.getReader();
  const decoder = new TextDecoder();
  const parser: EventParser = transform.framing === "sse" ? new SseParser() : new NdjsonParser();
  /** AWS's event stream is binary: it reads the raw bytes, the text framings read decoded text. */
  const binary = transform.framing === "aws-eventstream" ? new AwsEventStreamParser() : undefined;
  let usage: Usage | undefined;
  let firstByteAt: number | undefined;
  let out = "";
  let failure: StreamFailure | undefined;
  /** Whether an event said something to the client (more than opening the message). */
  let answered = false;
  /** Whether a chunk was written to the client (the ': waiting' comment is none). */
  let chunkSent = false;
  /** The provider's terminal event came (StreamPart `end`): nothing after it is read. */
  let terminal = false;

  const onEvent = (data: string) => {
    if (failure || terminal) return;
    let parts: ReturnType<typeof transform.event>;
    try {
      parts = transform.event(data, state);
    } catch {
      failure = new StreamFailure(errorInfo(500, `${d.provider} sent an unreadable stream event for model ${d.modelName}`));
      return;
    }
    for (const part of parts) {
      if (part.type === "data") {
        out += sseEvent(part.data);
        answered ||= !part.opens;
      } else if (part.type === "chunk") {
        out += `data: ${JSON.stringify(part.chunk)}\n\n`;
        answered ||= !part.opens;
      } else if (part.type === "usage") usage = part.usage;
      else if (part.type === "end") terminal = true;
      else {
        const error = streamErrorOf(a.adapter, part.error);
        failure = new StreamFailure({ ...error, message: withoutCredentials(error.message, d) });
        return;
      }
    }
  };
  /** What a parser threw (a corrupt frame: bad CRC, cut message; an event past its bound) ends the stream. */
  const corrupt = (err: unknown) => {
    failure ??= new StreamFailure(errorInfo(500, `${d.provider} sent a corrupt event stream for model ${d.modelName}: ${err instanceof Error ? err.message : String(err)}`));
  };
  /**
   * The transform's estimate of a stream that ended without the upstream's counts, never more
   * answer tokens than the request allowed: counting chunks (a role or finish chunk has no token)
   * would charge more than budgets reserved, and spend could pass a budget.
   */
  const estimated = (): Usage => {
    // Before the model said anything (only an opening chunk, or nothing, came): the prompt alone,
    // as budgets estimate it, as for a JSON call left before its answer (however long it waited).
    // The model an opening chunk named stays: a deployment priced only by it (Azure's) is not free.
    const e = transform.estimate(state);
    if (!answered) return { promptTokens: promptSize(a.endpoint, a.request).estimate, completionTokens: 0, ...(e.answerModel === undefined ? {} : { answerModel: e.answerModel }) };
    const bound = answerTokenBound(a.endpoint, a.request);
    if (bound === undefined || e.completionTokens <= bound) return e;
    // Its parts (reasoning) stay parts of the total.
    return { ...e, completionTokens: bound, ...(e.reasoningTokens === undefined ? {} : { reasoningTokens: Math.min(e.reasoningTokens, bound) }) };
  };
  /**
   * For a client that asked for usage (`stream_options.include_usage`) when the upstream sent none:
   * a last chunk with the counts the call is charged, estimated, as LiteLLM sends one.
   */
  const estimatedUsageChunk = (): string => {
    if (usage !== undefined || a.request.stream_options?.include_usage !== true) return "";
    const id = transform.responseId?.(state) ?? chatCompletionId();
    const object = a.endpoint === "chat" ? "chat.completion.chunk" : "text_completion";
    return `data: ${JSON.stringify({ id, object, created: nowSeconds(), model: a.request.model, choices: [], usage: openAIUsage(estimated()) })}\n\n`;
  };
  const end = (status: CallStatus, error?: ErrorInfo) => {
    deadline.clear();
    // Without the upstream's counts (a client that left, before the first event too: the upstream
    // has the prompt and bills it, as for a JSON call left before its answer), the estimate.
    const used = usage ?? estimated();
    // A stream that failed before any chunk reached the client is logged by its call id: the
    // answer's id (made up by some transforms) is one the client never saw.
    const responseId = status === "failure" && !chunkSent ? undefined : transform.responseId?.(state);
    // A stream that failed after its answer began (cut, stalled, an error event) is charged what
    // it streamed, as one its client left: the upstream bills the tokens it generated, and the
    // client has them. One that failed before is an attempt's error, not charged.
    a.finish(status, used, error, firstByteAt, responseId, status !== "failure" || answered);
  };
  /**
   * An SSE body's text before the stream's first event that said something (while short): a server
   * may answer a stream with a JSON body instead, as OpenAI-compatible ones answer an error with a 200.
   */
  let unframed: string | undefined = transform.framing === "sse" ? "" : undefined;
  /** Reads one upstream read's bytes. */
  const feed = (bytes: Uint8Array) => {
    try {
      if (binary) binary.push(bytes, onEvent);
      else {
        const text = decoder.decode(bytes, { stream: true });
        if (unframed !== undefined) unframed = answered || unframed.length + text.length > MAX_UNFRAMED_CHARS ? undefined : unframed + text;
        parser.push(text, onEvent);
      }
    } catch (err) {
      corrupt(err);
    }
  };
  /** What ended the stream once the upstream body ended: null when the answer is whole (memoized: read once). */
  let bodyEnd: ErrorInfo | null | undefined;
  /** Reads what the parser held at the end of the body; the error that ends the stream, or null. */
  const endOfBody = (): ErrorInfo | null => {
    if (bodyEnd !== undefined) return bodyEnd;
    // A body that is one JSON object and no event (`{"error": …}` with a 200) is read as that one
    // event: its error fails the call as the upstream said it, not as a cut.
    const json = answered || failure ? undefined : unframed?.trim();
    if (json?.startsWith("{") && isWholeEvent(json)) onEvent(json);
    const failedBefore = failure !== undefined;
    const wholeBefore = transform.complete?.(state) === true;
    try {
      if (binary) binary.end(onEvent);
      else {
        parser.push(decoder.decode(), onEvent);
        // The body ended inside an event (no blank line after it): kept if it is whole, else
        // it is torn, not an answer to pass on (dropped after a whole answer, the cut otherwise).
        parser.end((data) => {
          if (isWholeEvent(data)) onEvent(data);
          else if (!wholeBefore) failure ??= new StreamFailure(errorInfo(503, `stream from ${d.provider} for model ${d.modelName} ended inside an event`));
        });
      }
    } catch (err) {
      corrupt(err);
    }
    // A torn event after the end of the answer (a body cut mid-way through `data: [DONE]`) loses nothing.
    if (!failedBefore && wholeBefore) failure = undefined;
    // A body that ends before the upstream's end of answer was cut short (a half event left
    // at the end is the same cut, not an unreadable event).
    if (!failedBefore && transform.complete && !transform.complete(state)) {
      bodyEnd = errorInfo(503, `stream from ${d.provider} for model ${d.modelName} ended before the answer was complete`);
    } else bodyEnd = failure?.error ?? null;
    return bodyEnd;
  };
  let ended = false;
  const stop = (reason?: unknown) => {
    if (ended) return;
    ended = true;
    deadline.controller.abort(reason);
    void reader.cancel(reason).catch(() => undefined);
    end("cancelled");
  };
  /** The upstream read the pull awaits next (the wait for the first event starts it). */
  let reading = reader.read();

  /**
   * Reads until the stream's first event that says something. An upstream that fails before it, in
   * band after its 200 (Anthropic's `overloaded_error` event, Gemini's blocked prompt), or whose
   * stream breaks first, fails the attempt before the client got anything: the router retries it or
   * falls back as for an HTTP error, and a client for whom every attempt fails gets the error's
   * status, not a 200 and an error event.
   */
  const firstEvent = async (): Promise<void> => {
    while (!answered && !failure && !terminal) {
      deadline.arm();
      let next: Awaited<typeof reading>;
      try {
        next = await reading;
      } catch (err) {
        deadline.clear();
        if (deadline.clientGone) throw err;
        if (deadline.timedOut) throw timeoutError(d, deadline.seconds);
        throw GatewayError.of(503, `stream from ${d.provider} for model ${d.modelName} ended unexpectedly`, "api_connection_error");
      }
      deadline.clear();
      if (next.done) {
        reading = Promise.resolve(next);
        // A body that ends before the first event that said something (empty, only the opening
        // chunk, a JSON error) fails the attempt, as a cut or an error event before it does.
        const error = endOfBody();
        if (error && !answered) throw new GatewayError(error);
        break;
      }
      firstByteAt ??= Date.now();
      feed(next.value);
      reading = reader.read();
    }
    // An error after the answer began (in the same read) ends the stream in band, as later ones do.
    if (failure && !answered) {
      void reader.cancel().catch(() => undefined);
      throw new GatewayError(failure.error);
    }
  };
  // Raced once against the quiet timer (not at every read): a model slow to its first event gets
  // its response, with the ': waiting' comment, after WAITING_AFTER_MS, and the wait goes on in the
  // pull, where a failure is then told in band.
  const quiet = new Promise<typeof NOT_READY>((resolve) => deadline.whenQuiet(WAITING_AFTER_MS, () => resolve(NOT_READY)));
  const first = firstEvent();
  const quietAtFirst = (await Promise.race([first, quiet])) === NOT_READY;
  if (quietAtFirst) first.catch(() => undefined);
  else deadline.cancelQuiet();

  // Bun's "direct" stream: one pull drives the whole response, writing strings straight to the
  // socket. Far cheaper per stream than a queued ReadableStream, with the same backpressure
  // (an awaited write) and the same cancel signal (write returns 0, or cancel is called).
  const source: Bun.DirectUnderlyingSource<Uint8Array> = {
    type: "direct",
    async pull(c) {
      /** Sends `text`; false once the client has gone. */
      const send = async (text: string): Promise<boolean> => {
        deadline.cancelQuiet();
        a.tap?.(text);
        const written = c.write(text);
        const n = typeof written === "number" ? written : await written;
        if (n === 0 && text.length > 0) return false;
        const flushed = c.flush();
        if (typeof flushed !== "number") await flushed;
        return true;
      };
      const finishWith = async (error: ErrorInfo) => {
        chunkSent ||= out !== "";
        await send(`${out}data: ${JSON.stringify(errorBody(error))}\n\n`);
        out = "";
        void reader.cancel().catch(() => undefined);
        ended = true;
        end("failure", error);
        c.close();
      };
      /** The end of the upstream body, or its terminal event: the answer ends as the upstream ended it. */
      const finishBody = async () => {
        const error = endOfBody();
        if (error) return finishWith(error);
        // After a terminal event the upstream may still hold the body open: nothing more is read.
        if (terminal) void reader.cancel().catch(() => undefined);
        // Returning from pull ends a direct stream; Bun finishes the response natively.
        await send(out + estimatedUsageChunk() + DONE);
        ended = true;
        end("success");
        // Closing ends the stream for a reader inside the gateway too (the Gemini-style routes
        // read this response); Bun.serve would end it on return alone.
        c.close();
      };
      if (quietAtFirst) {
        c.write(WAITING);
        c.flush();
        try {
          await first;
        } catch (err) {
          if (ended || deadline.clientGone) return stop();
          return finishWith(err instanceof GatewayError ? err.info : errorInfo(503, `stream from ${d.provider} for model ${d.modelName} ended unexpectedly`));
        }
      }
      const failedEarly: StreamFailure | undefined = failure;
      if (failedEarly) return finishWith(failedEarly.error);
      if (terminal) return finishBody();
      // What came up to the first event that said something goes out now, unless more has come
      // already (then with it, in one write, as below).
      if (out && !(await settled(reading))) {
        const text = out;
        out = "";
        chunkSent = true;
        if (!(await send(text))) return stop("client disconnected");
      }
      for (;;) {
        let next: Awaited<ReturnType<typeof reader.read>>;
        // The idle deadline runs only while waiting on the upstream, never on a slow client.
        deadline.arm();
        try {
          next = await reading;
          deadline.clear();
        } catch {
          deadline.clear();
          if (ended || deadline.clientGone) return stop();
          const msg = deadline.timedOut
            ? `stream from ${d.provider} for model ${d.modelName} stalled for more than ${deadline.seconds}s`
            : `stream from ${d.provider} for model ${d.modelName} ended unexpectedly`;
          return finishWith(errorInfo(deadline.timedOut ? 408 : 503, msg));
        }
        if (ended) return;
        if (next.done) return finishBody();
        firstByteAt ??= Date.now();
        feed(next.value);
        if (failure) return finishWith(failure.error);
        if (terminal) return finishBody();
        reading = reader.read();
        // When more upstream data is already buffered, keep collecting: one write for what
        // arrived together. Otherwise send now, so the client sees each event as it comes.
        if (out && !(await settled(reading))) {
          const text = out;
          out = "";
          chunkSent = true;
          if (!(await send(text))) return stop("client disconnected");
        }
      }
    },
    cancel: (reason) => stop(reason),
  };
  // The DOM lib's ReadableStream overloads hide Bun's direct-source one.
  const body = new ReadableStream(source as unknown as UnderlyingDefaultSource<Uint8Array>);
  return new Response(body, {
    headers: { ...a.headers, "cache-control": "no-cache", connection: "keep-alive" },
  });
}
