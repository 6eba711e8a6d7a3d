// The peers' side of the side-by-side benchmark (main.go runs it): each
// scenario of work.mjs through @openai/agents (a function tool's
// timeoutMs), the Vercel ai package (generateText's abortSignal; there is
// no per-tool budget) and the MCP TypeScript SDK's client (timeout,
// resetTimeoutOnProgress, maxTotalTimeout) against server.mjs, and the
// same client calling server.mjs's tools through `timebox mcp serve` (the
// built binary TB_BIN serving TB_AGENT, main.go's agent file: its mcp
// entry, and mcpr, the same server with on_ignored_cancel: restart),
// where timebox's budgets act and the client waits 30s. Each round
// prints one JSON line: when the caller got control back, measured from
// when the tool's work began, what it was told, and whether the work's
// process was still running then and 500ms later.
//
//   node bench/peers/peers.mjs ROUNDS
import { createServer } from 'node:http';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { z } from 'zod';
import { Agent, run, tool as agentTool, OpenAIChatCompletionsModel, setTracingDisabled } from '@openai/agents';
import OpenAI from 'openai';
import { generateText, tool as aiTool, stepCountIs } from 'ai';
import { MockLanguageModelV3 } from 'ai/test';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { runTool, sleep } from './work.mjs';

const here = dirname(fileURLToPath(import.meta.url));
const rounds = Number(process.argv[2] || 5);
const dir = mkdtempSync(join(tmpdir(), 'tb-peers-'));
const scenarios = ['hung', 'ignore', 'silent'];

// The budget each scenario runs under, in each system's own terms: 1s for
// a hung tool; for a tool that goes silent after 1s of progress, 1s of
// silence where the system has an idle budget, else a 2s total (when the
// idle budget would fire).
const budgetMS = { hung: 1000, ignore: 1000, silent: 2000 };

// alive: the process exists and is not a zombie. A killed tree's orphans
// are reparented to PID 1, which in a container may never reap them;
// kill(pid, 0) would still find them.
function alive(pid) {
  try {
    process.kill(pid, 0);
  } catch {
    return false;
  }
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3) !== 'Z';
  } catch {
    return false;
  }
}
const pidOf = (file) => Number(readFileSync(file, 'utf8'));

// observe records a round: t0 when the work began, now when the caller got
// control back, told what it was told; then looks again 500ms later and
// kills what is left, so that rounds do not pile up.
async function observe(system, scenario, round, t0, told, pidfile) {
  const back = performance.now();
  let pid = 0;
  try {
    pid = pidOf(pidfile);
  } catch {}
  const atReturn = pid > 0 && alive(pid);
  await sleep(500);
  const later = pid > 0 && alive(pid);
  if (pid > 0 && later) process.kill(pid, 'SIGKILL');
  rmSync(pidfile, { force: true });
  console.log(JSON.stringify({ system, scenario, round, after_ms: Math.round(back - t0 - budgetMS[scenario]),
    told: String(told).replace(/\s+/g, ' ').slice(0, 120), running_at_return: atReturn, running_500ms: later }));
}

// --- @openai/agents, against a fake OpenAI-compatible Chat Completions
// server: the first request asks for the tool, the next (with its result)
// is answered. The agent loop has the tool's result when that second
// request arrives: that is when its caller has control back.
let onResult = null;
const fake = createServer((req, res) => {
  let body = '';
  req.on('data', (c) => (body += c));
  req.on('end', () => {
    const r = JSON.parse(body);
    const result = r.messages.find((m) => m.role === 'tool');
    const message = result
      ? { role: 'assistant', content: 'done' }
      : { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'work', arguments: '{}' } }] };
    if (result && onResult) onResult(typeof result.content === 'string' ? result.content : JSON.stringify(result.content));
    res.setHeader('content-type', 'application/json');
    res.end(JSON.stringify({ id: 'x', object: 'chat.completion', created: 0, model: 'fake',
      choices: [{ index: 0, message, finish_reason: result ? 'stop' : 'tool_calls' }],
      usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 } }));
  });
});
await new Promise((r) => fake.listen(0, '127.0.0.1', r));
setTracingDisabled(true);
const openai = new OpenAI({ baseURL: `http://127.0.0.1:${fake.address().port}/v1`, apiKey: 'offline' });

async function openaiAgents(scenario, round) {
  const pidfile = join(dir, `agents-${scenario}.pid`);
  let t0 = 0;
  const work = agentTool({
    name: 'work', description: 'Does the work.', parameters: z.object({}),
    timeoutMs: budgetMS[scenario],
    execute: async (_input, _ctx, details) => {
      t0 = performance.now();
      return runTool(scenario, pidfile, details?.signal, null);
    },
  });
  const agent = new Agent({ name: 'peers', instructions: 'Call the tool.', tools: [work],
    model: new OpenAIChatCompletionsModel(openai, 'fake') });
  const got = new Promise((resolve) => (onResult = resolve));
  const done = run(agent, 'go');
  const told = await got;
  await observe('@openai/agents', scenario, round, t0, told, pidfile);
  await done;
}

// --- the ai package, with ai/test's mock model: the first call asks for
// the tool, the next answers. ai has no per-tool budget: the turn's
// abortSignal is the budget, counted from the start of the tool.
async function vercelAI(scenario, round) {
  const pidfile = join(dir, `ai-${scenario}.pid`);
  const usage = { inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 }, outputTokens: { total: 1, text: 1, reasoning: 0 } };
  let calls = 0;
  const model = new MockLanguageModelV3({
    doGenerate: async () => (calls++ === 0
      ? { content: [{ type: 'tool-call', toolCallId: 'c1', toolName: 'work', input: '{}' }], finishReason: { unified: 'tool-calls', raw: 'tool_calls' }, usage, warnings: [] }
      : { content: [{ type: 'text', text: 'done' }], finishReason: { unified: 'stop', raw: 'stop' }, usage, warnings: [] }),
  });
  const controller = new AbortController();
  let t0 = 0;
  const work = aiTool({
    description: 'Does the work.', inputSchema: z.object({}),
    execute: async (_input, { abortSignal }) => {
      t0 = performance.now();
      setTimeout(() => controller.abort(), budgetMS[scenario]);
      return runTool(scenario, pidfile, scenario === 'ignore' ? null : abortSignal, null);
    },
  });
  let told;
  try {
    const r = await generateText({ model, tools: { work }, stopWhen: stepCountIs(2), abortSignal: controller.signal, prompt: 'go' });
    told = 'answered: ' + r.text;
  } catch (e) {
    told = `${e.name}: ${e.message}`;
  }
  await observe('ai (Vercel)', scenario, round, t0, told, pidfile);
}

// --- the MCP TypeScript SDK's client against server.mjs.
const mcp = new Client({ name: 'peers', version: '1.0.0' });
await mcp.connect(new StdioClientTransport({ command: process.execPath, args: [join(here, 'server.mjs')],
  env: { ...process.env, PEERS_DIR: dir }, stderr: 'ignore' }));

async function mcpSDK(scenario, round) {
  const pidfile = join(dir, `${scenario}.pid`);
  const opts = scenario === 'silent'
    ? { timeout: 1000, resetTimeoutOnProgress: true, maxTotalTimeout: 10000, onprogress: () => {} }
    : { timeout: budgetMS[scenario] };
  const t0 = performance.now();
  let told;
  try {
    const r = await mcp.callTool({ name: scenario, arguments: {} }, undefined, opts);
    told = 'result: ' + r.content?.[0]?.text;
  } catch (e) {
    told = `${e.constructor.name}: ${e.message}`;
  }
  await observe('MCP TS SDK', scenario, round, t0, told, pidfile);
}

// --- the same client calling the same server's tools through timebox mcp
// serve: the tools' budgets are timebox's (1s; silent: 1s idle within
// 10s), the client's own timeout a generous 30s, reset on progress.
async function viaTimebox(entry, label) {
  const client = new Client({ name: 'peers', version: '1.0.0' });
  await client.connect(new StdioClientTransport({ command: process.env.TB_BIN,
    args: ['mcp', 'serve', '-f', process.env.TB_AGENT, '--no-store'],
    env: { ...process.env, PEERS_DIR: dir }, stderr: 'ignore' }));
  return [label, async (scenario, round) => {
    const pidfile = join(dir, `${scenario}.pid`);
    const t0 = performance.now();
    let told;
    try {
      const r = await client.callTool({ name: `${entry}__${scenario}`, arguments: {} }, undefined,
        { timeout: 30000, resetTimeoutOnProgress: true, onprogress: () => {} });
      const text = r.content?.[0]?.text ?? '';
      told = r.isError ? 'isError: ' + errorText(text) : 'result: ' + text;
    } catch (e) {
      told = `${e.constructor.name}: ${e.message}`;
    }
    await observe(label, scenario, round, t0, told, pidfile);
  }, () => client.close()];
}

// errorText shortens timebox's error object to its type and message.
function errorText(text) {
  try {
    const e = JSON.parse(text).error;
    if (e?.type) return `${e.type}: ${e.message}`;
  } catch {}
  return text;
}

const systems = [['agents', openaiAgents], ['ai', vercelAI], ['mcp', mcpSDK]];
const closers = [];
if (process.env.TB_BIN) {
  for (const [entry, label] of [['mcp', 'MCP TS SDK → timebox mcp serve'], ['mcpr', 'MCP TS SDK → timebox mcp serve, on_ignored_cancel: restart']]) {
    const [name, fn, close] = await viaTimebox(entry, label);
    systems.push([name, fn]);
    closers.push(close);
  }
}
for (const [name, fn] of systems) {
  for (const scenario of scenarios) {
    for (let round = 1; round <= rounds; round++) {
      await fn(scenario, round);
    }
  }
}
await mcp.close();
for (const close of closers) await close();
fake.close();
rmSync(dir, { recursive: true, force: true });
