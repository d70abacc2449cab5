/**
 * A TCP relay in front of a local server (PostgreSQL, Redis) that a test can cut — open
 * connections dropped, new ones refused — and restore, so "the database/Redis went away" is exact
 * rather than a race with the real server's restart. `delayMs` (for connections made after it is
 * set) holds what clients send for that long before passing it on, in order: a server farther away.
 */
import { connect, createServer, type Server, type Socket } from "node:net";

export class TcpRelay {
  private readonly sockets = new Set<Socket>();
  private down = false;
  /** How long what clients of connections made from now on send waits before it goes on to the server. */
  delayMs = 0;
  private constructor(private readonly server: Server) {}

  static async start(target: { host: string; port: number }): Promise<TcpRelay> {
    let relay: TcpRelay | undefined;
    const server = createServer((client) => {
      if (!relay || relay.down) {
        client.destroy();
        return;
      }
      const upstream = connect(target.port, target.host);
      for (const s of [client, upstream]) {
        relay.sockets.add(s);
        s.on("error", () => undefined);
        s.on("close", () => {
          relay?.sockets.delete(s);
          client.destroy();
          upstream.destroy();
        });
      }
      const delay = relay.delayMs;
      if (delay > 0) {
        client.on("data", (chunk) => setTimeout(() => upstream.write(chunk), delay));
        client.on("end", () => setTimeout(() => upstream.end(), delay));
      } else client.pipe(upstream);
      upstream.pipe(client);
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    relay = new TcpRelay(server);
    return relay;
  }

  get port(): number {
    const addr = this.server.address();
    if (!addr || typeof addr === "string") throw new Error("relay not listening");
    return addr.port;
  }

  cut(): void {
    this.down = true;
    for (const s of this.sockets) s.destroy();
  }

  restore(): void {
    this.down = false;
  }

  async close(): Promise<void> {
    this.cut();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}
