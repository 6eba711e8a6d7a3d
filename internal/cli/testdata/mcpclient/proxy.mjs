// proxy.mjs drives `timebox mcp serve` over stdio with the official MCP
// TypeScript SDK's client, the agent file serving an mcp entry's server
// (@modelcontextprotocol/server-everything, as the entry "everything"),
// and prints what it saw as one JSON object for the Go test
// (internal/cli/mcp_proxy_test.go). TB_BIN is the timebox binary, TB_AGENT
// the agent file.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { CallToolResultSchema } from "@modelcontextprotocol/sdk/types.js";

const env = process.env;
const out = {};
const text = (r) => (r?.content?.[0]?.type === "text" ? r.content[0].text : "");

const transport = new StdioClientTransport({
  command: env.TB_BIN,
  args: ["mcp", "serve", "-f", env.TB_AGENT, "--no-store"],
  env: { ...process.env },
  stderr: "inherit",
});
const client = new Client({ name: "timebox-sdk-proxy-test", version: "1" });
await client.connect(transport);
out.tools = (await client.listTools()).tools.map((t) => t.name);

let r = await client.callTool({ name: "everything__echo", arguments: { message: "héllo through timebox" } }, CallToolResultSchema, {
  timeout: 20000,
});
out.echo = { isError: r.isError === true, text: text(r) };

// 30 s of work under the entry's 1s override, while the client would wait
// 20 s (and reset its timer on every progress notification).
const notes = [];
const began = Date.now();
try {
  r = await client.callTool(
    { name: "everything__trigger-long-running-operation", arguments: { duration: 30, steps: 300 } },
    CallToolResultSchema,
    { timeout: 20000, resetTimeoutOnProgress: true, onprogress: (p) => notes.push(p) },
  );
  out.long = { ms: Date.now() - began, isError: r.isError === true, text: text(r), notes };
} catch (e) {
  out.long = { ms: Date.now() - began, error: String(e), notes };
}

await client.close();
process.stdout.write(JSON.stringify(out) + "\n");
