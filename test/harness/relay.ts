/**
 * A TCP relay in front of a local server (PostgreSQL, Redis) that a test can cut — open
 * connections dropped, new ones accepted and closed at once — and restore, or stop listening
 * (`refuse`: connects refused, as by a restarting server or a host that is down) and listen again
 * on the same port (`listenAgain`), so "the database/Redis went away" is exact
 * rather than a race with the real server's restart. `delayMs` (for connections made after it is
 * set) holds what clients send for that long before passing it on, in order: a server farther away.
 */
import { connect, createServer, type Server, type Socket } from "node:net";

export class TcpRelay {
  private readonly sockets = new Set<Socket>();
  private down = false;
  /** While stalled, bytes either way are held (connections stay open, new ones are accepted), as over a link that stopped passing packets. */
  private stalled = false;
  private readonly held: { to: Socket; chunk: Buffer }[] = [];
  /** Connections that pass nothing any more, either way, and stay open (`stallOpen`). */
  private readonly silent = new Set<Socket>();
  /** While set, what the server sends is dropped (`dropReplies`): requests arrive and run, their answers are lost. */
  private deaf = false;
  private readonly clients = new WeakSet<Socket>();
  /** How long what clients of connections made from now on send waits before it goes on to the server. */
  delayMs = 0;
  private constructor(
    private readonly server: Server,
    /** Kept: the server has no address while it is not listening. */
    readonly port: number,
  ) {}

  static async start(target: { host: string; port: number }): Promise<TcpRelay> {
    let relay: TcpRelay | undefined;
    const server = createServer((client) => {
      if (!relay || relay.down) {
        client.destroy();
        return;
      }
      const r = relay;
      r.clients.add(client);
      const upstream = connect(target.port, target.host);
      for (const s of [client, upstream]) {
        r.sockets.add(s);
        s.on("error", () => undefined);
        s.on("close", () => {
          r.sockets.delete(s);
          r.silent.delete(s);
          client.destroy();
          upstream.destroy();
        });
      }
      const delay = r.delayMs;
      client.on("data", (chunk: Buffer) => (delay > 0 ? setTimeout(() => r.pass(upstream, chunk), delay) : r.pass(upstream, chunk)));
      client.on("end", () => (delay > 0 ? setTimeout(() => upstream.end(), delay) : upstream.end()));
      upstream.on("data", (chunk: Buffer) => r.pass(client, chunk));
      upstream.on("end", () => client.end());
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const addr = server.address();
    if (!addr || typeof addr === "string") throw new Error("relay not listening");
    relay = new TcpRelay(server, addr.port);
    return relay;
  }

  private pass(to: Socket, chunk: Buffer): void {
    if (this.silent.has(to) || (this.deaf && this.clients.has(to))) return;
    if (this.stalled) this.held.push({ to, chunk });
    else if (!to.destroyed) to.write(chunk);
  }

  /** Stops passing bytes either way; connections stay open. */
  stall(): void {
    this.stalled = true;
  }

  /**
   * The connections open now pass nothing more, either way, for good, and stay open; new ones work.
   * As behind a proxy that hung, or a NAT that forgot them: only a new connection gets through.
   */
  stallOpen(): void {
    for (const s of this.sockets) this.silent.add(s);
  }

  /** From now until `passReplies`, what the server sends is dropped: requests still reach it and run, their answers never come back. */
  dropReplies(): void {
    this.deaf = true;
  }

  passReplies(): void {
    this.deaf = false;
  }

  /** Passes on what was held, in order, and passes bytes again. */
  resume(): void {
    this.stalled = false;
    for (const { to, chunk } of this.held.splice(0)) if (!to.destroyed) to.write(chunk);
  }

  cut(): void {
    this.down = true;
    for (const s of this.sockets) s.destroy();
  }

  restore(): void {
    this.down = false;
  }

  /** Open connections dropped and the port closed: connects are refused until `listenAgain`. */
  async refuse(): Promise<void> {
    this.cut();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  /** Listens again on the same port, after `refuse`. */
  async listenAgain(): Promise<void> {
    await new Promise<void>((resolve) => this.server.listen(this.port, "127.0.0.1", resolve));
    this.restore();
  }

  async close(): Promise<void> {
    if (this.server.listening) await this.refuse();
    else this.cut();
  }
}
