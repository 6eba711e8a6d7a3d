// wiretap runs a stdio MCP server and logs every message in each direction
// with a wall-clock timestamp, so that two clients are measured by the same
// instrument at the server's door:
//
//   node wiretap.mjs LOG COMMAND [ARGS...]
//
// Each line of LOG is {"t": ms since the epoch (µs precision), "dir": "c2s"
// or "s2c", "method", "id", "token", "requestId", "reason"}. The server's
// stdin closes when the client's does; the wiretap exits with the server.
import { spawn } from "node:child_process";
import { createWriteStream } from "node:fs";
import readline from "node:readline";

const [log, command, ...args] = process.argv.slice(2);
const out = createWriteStream(log);
const now = () => performance.timeOrigin + performance.now();
const child = spawn(command, args, { stdio: ["pipe", "pipe", "inherit"] });

function tap(dir, line) {
  let m;
  try {
    m = JSON.parse(line);
  } catch {
    return;
  }
  const p = m.params ?? {};
  out.write(JSON.stringify({
    t: now(), dir, method: m.method, id: m.id,
    token: p._meta?.progressToken ?? p.progressToken,
    requestId: p.requestId, reason: p.reason,
  }) + "\n");
}

readline.createInterface({ input: process.stdin }).on("line", (line) => {
  tap("c2s", line);
  child.stdin.write(line + "\n");
});
process.stdin.on("end", () => child.stdin.end());
readline.createInterface({ input: child.stdout }).on("line", (line) => {
  tap("s2c", line);
  process.stdout.write(line + "\n");
});
child.on("exit", (code, signal) => out.end(() => process.exit(code ?? (signal ? 1 : 0))));
for (const sig of ["SIGTERM", "SIGINT"]) process.on(sig, () => child.kill(sig));
