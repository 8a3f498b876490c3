// Drives the head's page in headless Chromium (playwright-core); prints one JSON object of what
// it saw. `node page.cjs BASE_URL SCREENSHOT_DIR QUESTION SECOND_QUESTION MAX_TOKENS`
// The Rust test (crates/node/tests/page.rs) starts the ring and checks what this prints.
"use strict";
const { chromium } = require("playwright-core");
const path = require("path");

const [base, shots, question, second, maxTokens] = process.argv.slice(2);
const out = { screenshots: [] };

async function main() {
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-gpu"],
  });
  try {
    const page = await browser.newPage({ viewport: { width: 1200, height: 900 } });
    const errors = [];
    page.on("pageerror", (e) => errors.push(String(e)));
    await page.goto(base + "/");

    // The ring: three devices, each with its layers and, for members, a finished download.
    await page.waitForFunction(
      () => document.querySelectorAll("#devices .device[data-ready=true][data-layers]:not([data-layers=''])").length === 3,
      null,
      { timeout: 120000 },
    );
    out.devices = await page.$$eval("#devices .device", (ds) =>
      ds.map((d) => ({
        name: d.dataset.name,
        layers: d.dataset.layers,
        ready: d.dataset.ready === "true",
        status: d.dataset.status,
        download: d.querySelector(".download").textContent,
      })),
    );
    out.ring_nodes = await page.$$eval("#ring .node", (ns) => ns.map((n) => n.dataset.name));

    // A chat question with Verify (ticked by default), then a second one while the first runs.
    out.verify_ticked = await page.isChecked("#verify");
    await page.fill("#max_tokens", maxTokens);
    await page.fill("#prompt", question);
    // Count the answer's updates as the browser renders them.
    await page.evaluate(() => {
      window.__updates = [];
      new MutationObserver(() => {
        const a = document.querySelectorAll("#turns .turn");
        const first = a[a.length - 1];
        if (first) window.__updates.push(first.querySelector(".answer").textContent);
      }).observe(document.getElementById("turns"), { subtree: true, childList: true, characterData: true });
    });
    await page.click("#generate");
    await page.fill("#prompt", second);
    await page.click("#generate");
    // Turns are listed newest first: the second is the first child.
    const turn = (i) => `#turns .turn:nth-last-child(${i + 1})`;
    // The second waits for the ring, saying so with its prompt's token count: the status as the
    // wait saw it (read again afterwards, it may already say the second turn is generating).
    const waiting = await page.waitForFunction(
      (sel) => {
        const status = document.querySelector(sel + " .status").textContent;
        return /waiting \(\d+ prompt tokens\)/.test(status) ? status : false;
      },
      turn(1),
      { timeout: 60000, polling: 10 },
    );
    out.second_waiting = await waiting.jsonValue();
    // Mid-generation: some text, no Verify yet.
    await page.waitForFunction(
      (sel) => document.querySelector(sel + " .answer").textContent.length > 0,
      turn(0),
      { timeout: 120000, polling: 10 },
    );
    const mid = path.join(shots, "page-mid-generation.png");
    await page.screenshot({ path: mid, fullPage: true });
    out.screenshots.push(mid);
    out.mid_status = await page.textContent(turn(0) + " .status");

    for (const i of [0, 1]) {
      await page.waitForFunction(
        (sel) => document.querySelector(sel + " .verify").textContent.length > 0 ||
          document.querySelector(sel + " .status .error") !== null,
        turn(i),
        { timeout: 180000 },
      );
    }
    const after = path.join(shots, "page-after-verify.png");
    await page.screenshot({ path: after, fullPage: true });
    out.screenshots.push(after);
    out.turns = [];
    for (const i of [0, 1]) {
      out.turns.push({
        answer: await page.textContent(turn(i) + " .answer"),
        status: await page.textContent(turn(i) + " .status"),
        verify: await page.textContent(turn(i) + " .verify"),
        verify_class: await page.getAttribute(turn(i) + " .verify", "class"),
        chart: (await page.$$(turn(i) + " .picture rect.compute")).length,
        wire_bars: (await page.$$(turn(i) + " .picture rect.wire")).length,
        legend: await page.textContent(turn(i) + " .picture .legend"),
      });
    }
    // The same page on a phone.
    await page.setViewportSize({ width: 390, height: 844 });
    const phone = path.join(shots, "page-phone.png");
    await page.screenshot({ path: phone, fullPage: true });
    out.screenshots.push(phone);
    out.updates = await page.evaluate(() => new Set(window.__updates.filter((u) => u.length > 0)).size);
    out.page_errors = errors;
  } finally {
    await browser.close();
  }
}

main().then(
  () => console.log(JSON.stringify(out)),
  (e) => {
    console.error(e);
    process.exit(1);
  },
);
