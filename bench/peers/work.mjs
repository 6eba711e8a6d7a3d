// The tools' work, shared by every system of the benchmark: a real process
// (sleep 10) whose pid is written to a file, so that the harness can tell
// whether the work was still running when the caller got control back.
import { spawn } from 'node:child_process';
import { writeFileSync } from 'node:fs';

// work starts the process and resolves when it exits. With a signal it is
// killed when the signal aborts (a tool that honours its cancellation);
// without one it runs on (a tool that ignores it).
export function work(pidfile, signal) {
  const child = spawn('sleep', ['10'], signal ? { signal, stdio: 'ignore' } : { stdio: 'ignore' });
  writeFileSync(pidfile, String(child.pid));
  return new Promise((resolve) => {
    child.on('exit', resolve);
    child.on('error', resolve); // an abort reports an AbortError here
  });
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// The three scenarios, as every system runs them:
//   hung    the tool's work hangs; the tool honours its cancellation signal
//   ignore  the tool's work hangs; the tool ignores its cancellation
//   silent  the tool reports progress for 1s (where the system can carry
//           progress), then its work goes silent, honouring cancellation
export async function runTool(scenario, pidfile, signal, progress) {
  switch (scenario) {
    case 'hung':
      await work(pidfile, signal);
      return 'hung: done';
    case 'ignore':
      await work(pidfile, null);
      return 'ignore: done';
    case 'silent':
      for (let i = 1; i <= 5; i++) {
        await sleep(200);
        if (progress) await progress(i, 10);
      }
      await work(pidfile, signal);
      return 'silent: done';
  }
  throw new Error('unknown scenario ' + scenario);
}
