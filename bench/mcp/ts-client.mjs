// ts-client runs the benchmark's scenarios through the reference
// TypeScript MCP client (@modelcontextprotocol/sdk), each against its own
// server-everything behind the wiretap. The scenarios come as JSON on stdin
// from the Go harness (bench/mcp/main.go), which also runs them through
// timebox and compares; one JSON result per scenario goes to stdout.
//
//   node ts-client.mjs OUTDIR < scenarios.json
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import path from "node:path";

const here = path.dirname(fileURLToPath(import.meta.url));
const [outDir] = process.argv.slice(2);
const scenarios = JSON.parse(readFileSync(0, "utf8"));
const server = path.join(here, "node_modules", ".bin", "mcp-server-everything");
const now = () => performance.timeOrigin + performance.now();
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

for (const sc of scenarios) {
  const log = path.join(outDir, `ts-${sc.name}.jsonl`);
  const transport = new StdioClientTransport({
    command: process.execPath, args: [path.join(here, "wiretap.mjs"), log, server, "stdio"], stderr: "ignore",
  });
  const client = new Client({ name: "bench", version: "1" });
  const errors = [];
  client.onerror = (e) => errors.push(String(e?.message ?? e));
  await client.connect(transport);
  const calls = [];
  for (let i = 0; i < (sc.repeat || 1); i++) {
    const ac = new AbortController();
    let timer;
    if (sc.cancel_ms) timer = setTimeout(() => ac.abort(), sc.cancel_ms);
    let progress = 0;
    const started = now();
    let outcome = "ok", detail = "";
    try {
      await client.callTool({ name: sc.tool, arguments: sc.args }, undefined, {
        onprogress: () => progress++,
        signal: ac.signal,
        timeout: sc.ts.timeout_ms,
        resetTimeoutOnProgress: sc.ts.reset_on_progress,
        maxTotalTimeout: sc.ts.max_total_ms || undefined,
      });
    } catch (e) {
      // How the client reports the stop: its error class and code, and
      // its message.
      outcome = e?.code !== undefined ? `${e.constructor?.name ?? "Error"} ${e.code}` : (e?.name ?? "Error");
      detail = String(e?.message ?? e).replace(/^MCP error -?\d+: /, "");
    }
    const ended = now();
    clearTimeout(timer);
    calls.push({ started, ended, fired_ms: ended - started, outcome, detail, progress });
  }
  await sleep(sc.linger_ms);
  await client.close();
  console.log(JSON.stringify({ client: "ts", scenario: sc.name, calls, errors }));
}
// A request timer the SDK left behind must not hold the process open.
process.exit(0);
