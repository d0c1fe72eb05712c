// A thin bridge from host/cli/tests/ui.rs to headless Chromium: the Rust test keeps the
// scenario and its assertions, and sends one JSON command per line on stdin; this answers one
// JSON line per command on stdout ({"ok":true,"value":...} or {"ok":false,"error":"..."}).
//
// Commands (`sel` is a CSS selector, `nth` picks among its matches, 0 by default):
//   {"op":"goto","url":...}                 {"op":"fill","sel":...,"text":...}
//   {"op":"click","sel":...}                {"op":"count","sel":...}
//   {"op":"text","sel":...}   -> text or null when absent or hidden
//   {"op":"attr","sel":...,"name":...}      -> attribute or null
//   {"op":"value","sel":...}                -> an input's current value
//   {"op":"screenshot","path":...}          {"op":"errors"} -> the page's uncaught errors
//   {"op":"close"}
//
// Usage: node driver.mjs CHROMIUM_PATH
import { createInterface } from 'node:readline';
import { chromium } from 'playwright-core';

// Actions wait for their element this long; the Rust side has its own deadlines for values.
const ACTION_TIMEOUT_MS = 30000;

const executablePath = process.argv[2] || '/usr/bin/chromium';
const browser = await chromium.launch({
  executablePath,
  headless: true,
  // Root cannot use Chromium's sandbox; /dev/shm is small in containers.
  args: ['--no-sandbox', '--disable-dev-shm-usage', '--disable-gpu'],
});
const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
page.setDefaultTimeout(ACTION_TIMEOUT_MS);

const pageErrors = [];
page.on('pageerror', (error) => pageErrors.push(String(error)));
// The browser logs every 4xx answer as a console error; the API's errors are expected (a
// wrong token) and shown by the UI, so only other console errors count.
page.on('console', (message) => {
  if (message.type() === 'error' && !message.text().startsWith('Failed to load resource')) {
    pageErrors.push(`console: ${message.text()}`);
  }
});

const at = (command) => page.locator(command.sel).nth(command.nth ?? 0);

// Reads the `nth` match in one step in the page: the UI re-renders on its own timer, and an
// element counted a moment before may be gone when a waiting read runs (which would then wait
// out ACTION_TIMEOUT_MS instead of answering null).
async function visibleOrNull(command, read) {
  return page.locator(command.sel).evaluateAll(
    (elements, { nth, read, name }) => {
      const element = elements[nth];
      if (!element) return null;
      const style = getComputedStyle(element);
      const shown = element.getClientRects().length > 0 && style.visibility !== 'hidden';
      if (!shown) return null;
      return read === 'text' ? element.textContent : element.getAttribute(name);
    },
    { nth: command.nth ?? 0, read, name: command.name ?? null },
  );
}

const ops = {
  goto: async (c) => {
    await page.goto(c.url);
    return null;
  },
  fill: async (c) => {
    await at(c).fill(c.text);
    return null;
  },
  click: async (c) => {
    await at(c).click();
    return null;
  },
  count: async (c) => page.locator(c.sel).count(),
  text: async (c) => visibleOrNull(c, 'text'),
  attr: async (c) => visibleOrNull(c, 'attr'),
  value: async (c) => at(c).inputValue(),
  screenshot: async (c) => {
    await page.screenshot({ path: c.path, fullPage: true });
    return c.path;
  },
  errors: async () => pageErrors,
};

const reply = (answer) => process.stdout.write(`${JSON.stringify(answer)}\n`);

const lines = createInterface({ input: process.stdin });
for await (const line of lines) {
  if (!line.trim()) continue;
  let command;
  try {
    command = JSON.parse(line);
  } catch (e) {
    reply({ ok: false, error: `not JSON: ${e.message}` });
    continue;
  }
  if (command.op === 'close') break;
  const op = ops[command.op];
  if (!op) {
    reply({ ok: false, error: `unknown op ${command.op}` });
    continue;
  }
  try {
    reply({ ok: true, value: await op(command) });
  } catch (e) {
    reply({ ok: false, error: String(e.message || e) });
  }
}
await browser.close();
reply({ ok: true, value: 'closed' });
