/**
 * PostgreSQL connections that stop answering. A database behind a proxy that hung, or a NAT or
 * firewall that forgot the connection, leaves the TCP connection open (the local end, or the proxy,
 * even answers keep-alives), and postgres.js then waits for an answer forever: the spend writer
 * hung silently with every later call queued behind it, and the LISTEN connection stopped
 * delivering other instances' changes (a key blocked there kept working here) without an error.
 *
 * The sockets postgres.js uses are made here, and watched: one that owes an answer and has read
 * nothing for `answerMs` is destroyed. The queries on it fail (the writer keeps its entries and
 * retries), and postgres.js opens a new connection for the next ones (the listener re-listens,
 * which reloads the identity cache). What a connection owes is counted from the protocol itself:
 * every simple query (`Q`) and every `Sync` the client sends is answered by one `ReadyForQuery`
 * (`Z`), the start-up by one more; byte counts could not tell a query sent while the previous
 * answer was arriving from one already answered. Armed after the migrations: waiting for another
 * instance's migration lock is a request rightly unanswered for a long time. A TLS connection is
 * not watched (its bytes cannot be read here).
 */
import { connect, type Socket } from "node:net";

/** What postgres.js passes to its `socket` option (its parsed connection options). */
export interface PgSocketTarget {
  host: string[];
  port: number[];
  path?: string | false;
}

const QUERY = 0x51; // 'Q'
const SYNC = 0x53; // 'S'
const READY_FOR_QUERY = 0x5a; // 'Z'
/** The code of an SSLRequest, the start-up's first message when the connection asks for TLS. */
const SSL_REQUEST_CODE = 80877103;
/** The code of a StartupMessage (protocol 3.0), the first message of a session without TLS. */
const STARTUP_CODE = 196608;

/**
 * Reads the framing of a stream of protocol messages (a type byte, then an int32 length that
 * counts itself; the client's first message has no type byte) and counts those of some types.
 */
class MessageCounter {
  count = 0;
  /** The code of the untyped first message (an SSLRequest, a StartupMessage, a CancelRequest). */
  firstCode: number | undefined;
  private readonly header = new Uint8Array(5);
  private filled = 0;
  private skip = 0;

  constructor(
    private readonly counted: ReadonlySet<number>,
    private untypedFirst: boolean,
  ) {}

  feed(chunk: Uint8Array): void {
    let i = 0;
    while (i < chunk.length) {
      if (this.skip > 0) {
        const n = Math.min(this.skip, chunk.length - i);
        this.skip -= n;
        i += n;
        continue;
      }
      const size = this.untypedFirst ? 4 : 5;
      const n = Math.min(size - this.filled, chunk.length - i);
      this.header.set(chunk.subarray(i, i + n), this.filled);
      this.filled += n;
      i += n;
      if (this.filled < size) return;
      this.filled = 0;
      const view = new DataView(this.header.buffer);
      const length = view.getInt32(size - 4);
      if (this.untypedFirst) {
        this.untypedFirst = false;
        // postgres.js writes it whole, in one chunk.
        if (chunk.length - i >= 4) this.firstCode = new DataView(chunk.buffer, chunk.byteOffset + i, 4).getInt32(0);
      } else if (this.counted.has(this.header[0]!)) this.count++;
      this.skip = Math.max(0, length - 4);
    }
  }
}

/**
 * A session closed by the server before it was ready, without an error: a proxy or load balancer
 * whose database is down accepts the connection, then closes it. postgres.js took that for a
 * retry: it connected again at once, and again, holding the query the connection was opened for,
 * which waited for good (a management write with it, then applied once the database was back).
 * Reported to postgres.js as the socket's error, it fails that query as any failed connect does.
 */
function closedBeforeReady(target: string): Error {
  return Object.assign(new Error(`${target} closed the connection before the session was ready`), { code: "CONNECTION_CLOSED" });
}

interface Watched {
  socket: Socket;
  /** host:port or the socket path. */
  target: string;
  sent: MessageCounter;
  received: MessageCounter;
  /** When a byte was last read (ms, performance.now). */
  readAt: number;
  /** When the connection last went from owing nothing to owing an answer. */
  owingSince: number;
}

export class AnswerWatch {
  private readonly watched = new Set<Watched>();
  private timer: ReturnType<typeof setInterval> | undefined;
  private nextHost = 0;

  constructor(
    private readonly answerMs: number,
    private readonly onDrop: (detail: { waited_ms: number; host: string }) => void,
  ) {}

  /**
   * postgres.js's `socket` option: a socket to the hosts in turn (or the Unix socket path), returned
   * before it connects, as postgres.js makes its own (it holds what it writes until then). A connect
   * that fails reaches postgres.js as the socket's error and close, which fail the waiting queries and
   * let it connect again later; its `connect_timeout` runs from now. A function that threw or
   * rejected instead left the connection "connecting" for good (postgres.js 3.4.9): each failed
   * connect while PostgreSQL refused them cost the pool one of its connections, and it never
   * connected again once all were gone.
   */
  readonly connect = (target: PgSocketTarget): Socket => {
    const i = this.nextHost++ % Math.max(1, target.host.length);
    const host = target.host[i] ?? "localhost";
    const port = target.port[i] ?? target.port[0] ?? 5432;
    const socket = target.path ? connect(target.path) : connect(port, host);
    // As postgres.js labels its own: its connection errors (CONNECT_TIMEOUT) name them.
    Object.assign(socket, { host, port });
    const entry = this.counted(socket, target.path || `${host}:${port}`);
    // Silence is counted from the connect: waiting for one is the connect timeout's business.
    socket.once("connect", () => {
      entry.readAt = performance.now();
      if (entry.owingSince !== 0) entry.owingSince = entry.readAt;
      this.watched.add(entry);
    });
    return socket;
  };

  /** Counts what `socket` is sent and answers, from its first byte (the start-up is written before it connects). */
  private counted(socket: Socket, target: string): Watched {
    const entry: Watched = {
      socket,
      target,
      sent: new MessageCounter(new Set([QUERY, SYNC]), true),
      received: new MessageCounter(new Set([READY_FOR_QUERY]), false),
      readAt: performance.now(),
      owingSince: 0,
    };
    const write = socket.write;
    socket.write = function (this: Socket, chunk: unknown, ...rest: unknown[]) {
      if (chunk instanceof Uint8Array) {
        entry.sent.feed(chunk);
        if (entry.owingSince === 0) entry.owingSince = performance.now();
      }
      return (write as (...args: unknown[]) => boolean).call(this, chunk, ...rest);
    } as typeof socket.write;
    socket.on("data", (chunk: Uint8Array) => {
      entry.readAt = performance.now();
      entry.received.feed(chunk);
    });
    let failed = false;
    socket.once("error", () => {
      failed = true;
    });
    socket.once("close", () => {
      this.watched.delete(entry);
      if (!failed && entry.sent.firstCode === STARTUP_CODE && entry.received.count === 0) socket.emit("error", closedBeforeReady(target));
    });
    return entry;
  }

  arm(): void {
    if (this.timer) return;
    this.timer = setInterval(() => this.sweep(), Math.max(25, this.answerMs / 4));
    this.timer.unref?.();
  }

  private sweep(): void {
    const now = performance.now();
    let silentSince: number | undefined;
    for (const w of this.watched) {
      if (w.sent.firstCode === SSL_REQUEST_CODE) {
        this.watched.delete(w);
        continue;
      }
      // The start-up is answered by a ReadyForQuery too.
      if (w.sent.count + 1 <= w.received.count) {
        w.owingSince = 0;
        continue;
      }
      const since = Math.max(w.readAt, w.owingSince || w.readAt);
      if (now - since < this.answerMs) continue;
      this.close(w);
      this.onDrop({ waited_ms: Math.round(now - since), host: w.target });
      silentSince = Math.min(silentSince ?? since, since);
    }
    if (silentSince === undefined) return;
    // Whatever cut that connection off most likely cut off the others that have read nothing since
    // (idle ones included): closed now, rather than each failing its next query after the timeout.
    // A healthy idle one is only reopened when next needed.
    for (const w of this.watched) if (w.readAt <= silentSince) this.close(w);
  }

  private close(w: Watched): void {
    this.watched.delete(w);
    // Without an error: postgres.js then fails every query on the connection when it closes. With
    // one, it failed those it held at the error, and a query given to the connection between the
    // error and the close waited for good.
    w.socket.destroy();
  }

  stop(): void {
    clearInterval(this.timer);
    this.timer = undefined;
  }
}
