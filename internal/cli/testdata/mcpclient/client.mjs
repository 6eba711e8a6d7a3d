// client.mjs drives `timebox mcp serve` with the official MCP TypeScript
// SDK's client, as a real MCP client would, and prints what it saw as one
// JSON object on stdout for the Go test (internal/cli/mcp_sdk_test.go) to
// assert on. Its environment says what to connect to:
//
//   TB_TRANSPORT  "stdio" or "http"
//   TB_BIN        with stdio: the timebox binary, started as
//                 `TB_BIN mcp serve -f TB_AGENT` with this environment
//   TB_AGENT      with stdio: the agent file
//   TB_URL        with http: the server's URL; TB_TOKEN its bearer token
//   TB_PIDS       the file the hung tool writes its pids to
//
// The agent file is the one of mcp_test.go: fast, progress, hang (timeout
// 1s) and slow_hang (timeout 5m) exec tools.
import { readFileSync } from "node:fs";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { CallToolResultSchema } from "@modelcontextprotocol/sdk/types.js";

const env = process.env;
const out = {};
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function pids() {
  try {
    return readFileSync(env.TB_PIDS, "utf8").split(/\s+/).filter(Boolean);
  } catch {
    return [];
  }
}

// alive is run_test.go's: a pid is alive while /proc has it and it is not
// a zombie.
function alive(pid) {
  let s;
  try {
    s = readFileSync(`/proc/${pid}/stat`, "utf8");
  } catch {
    return false;
  }
  const i = s.lastIndexOf(")");
  return i < 0 || s.length < i + 3 || s[i + 2] !== "Z";
}

async function until(ms, f) {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (f()) return true;
    await sleep(20);
  }
  return f();
}

function text(r) {
  return r?.content?.[0]?.type === "text" ? r.content[0].text : "";
}

let transport;
if (env.TB_TRANSPORT === "stdio") {
  transport = new StdioClientTransport({
    command: env.TB_BIN,
    args: ["mcp", "serve", "-f", env.TB_AGENT, "--no-store"],
    env: { ...process.env },
    stderr: "inherit",
  });
} else {
  transport = new StreamableHTTPClientTransport(new URL(env.TB_URL), {
    requestInit: { headers: { Authorization: `Bearer ${env.TB_TOKEN}` } },
  });
}
const client = new Client({ name: "timebox-sdk-test", version: "1" });
await client.connect(transport);
out.server = client.getServerVersion();

const listed = await client.listTools();
out.tools = listed.tools.map((t) => t.name);
out.budget = listed.tools.find((t) => t.name === "hang")?._meta?.["timebox/budget"] ?? null;

// A hung tool with timeout: 1s, while the client would wait 20 s.
let began = Date.now();
try {
  const r = await client.callTool({ name: "hang", arguments: {} }, CallToolResultSchema, { timeout: 20000 });
  out.hang = { ms: Date.now() - began, isError: r.isError === true, text: text(r) };
} catch (e) {
  out.hang = { ms: Date.now() - began, error: String(e) };
}
out.hang.pids = pids();
out.hang.gone = await until(3000, () => out.hang.pids.every((p) => !alive(p)));

// Progress, on the token the SDK gives a call with onprogress.
const notes = [];
try {
  const r = await client.callTool({ name: "progress", arguments: {} }, CallToolResultSchema, {
    timeout: 20000,
    onprogress: (p) => notes.push(p),
  });
  out.progress = { isError: r.isError === true, text: text(r), notes };
} catch (e) {
  out.progress = { error: String(e), notes };
}

// A client's cancel: an AbortController aborted once the tool runs.
const ac = new AbortController();
const before = pids().length;
began = Date.now();
const call = client
  .callTool({ name: "slow_hang", arguments: {} }, CallToolResultSchema, { timeout: 20000, signal: ac.signal })
  .then((r) => ({ answered: true, isError: r.isError === true, text: text(r) }))
  .catch((e) => ({ answered: false, error: String(e) }));
const started = await until(10000, () => pids().length >= before + 2);
ac.abort("the user gave up");
out.cancel = { started, ...(await call) };
const mine = pids().slice(before);
out.cancel.pids = mine;
out.cancel.gone = await until(3000, () => mine.every((p) => !alive(p)));
out.cancel.ms = Date.now() - began;

// The server still answers after the cancel.
const r = await client.callTool({ name: "fast", arguments: {} }, CallToolResultSchema, { timeout: 20000 });
out.fast = { isError: r.isError === true, text: text(r) };

await client.close();
process.stdout.write(JSON.stringify(out) + "\n");
