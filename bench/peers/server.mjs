// An MCP server over stdio with one tool per scenario (work.mjs): the same
// server for timebox's MCP tools and for the MCP TypeScript SDK's client.
// A call's pid file is PEERS_DIR/<tool>.pid.
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js';
import { join } from 'node:path';
import { runTool } from './work.mjs';

const dir = process.env.PEERS_DIR;
const server = new McpServer({ name: 'peers', version: '1.0.0' });
for (const scenario of ['hung', 'ignore', 'silent']) {
  server.registerTool(scenario, { description: `The ${scenario} scenario.` }, async (extra) => {
    const token = extra._meta?.progressToken;
    const progress = token === undefined ? null : (progress, total) =>
      extra.sendNotification({ method: 'notifications/progress', params: { progressToken: token, progress, total } });
    const text = await runTool(scenario, join(dir, `${scenario}.pid`), extra.signal, progress);
    return { content: [{ type: 'text', text }] };
  });
}
await server.connect(new StdioServerTransport());
