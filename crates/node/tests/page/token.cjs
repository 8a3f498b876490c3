// The page asks for the head's Hugging Face token, is given it, answers, and forgets it; prints
// one JSON object of what it saw, with every URL, cookie and storage entry the browser held.
// `PAGE_TOKEN=… node token.cjs BASE_URL SCREENSHOT_DIR PROMPT`
"use strict";
const { chromium } = require("playwright-core");
const path = require("path");

const [base, shots, prompt] = process.argv.slice(2);
const token = process.env.PAGE_TOKEN;
const out = { urls: [] };

async function main() {
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-gpu"],
  });
  try {
    const context = await browser.newContext();
    const page = await context.newPage();
    page.on("request", (r) => out.urls.push(r.url()));
    page.on("framenavigated", (f) => out.urls.push(f.url()));
    await page.goto(base + "/");

    // The head cannot open its model without a token: the page asks.
    await page.waitForSelector("#token:not([hidden])", { timeout: 120000 });
    out.asked = await page.textContent("#token-why");
    out.input_type = await page.getAttribute("#token-input", "type");
    await page.fill("#token-input", token);
    await page.click("#token-give");
    out.input_after = await page.inputValue("#token-input");

    // With it the ring forms and answers.
    await page.waitForFunction(
      () => document.querySelectorAll("#devices .device[data-ready=true][data-layers]:not([data-layers=''])").length === 3,
      null,
      { timeout: 120000 },
    );
    await page.waitForSelector("#token-held:not([hidden])");
    await page.check("input[name=mode][value=raw]");
    await page.fill("#max_tokens", "8");
    await page.fill("#prompt", prompt);
    await page.click("#generate");
    await page.waitForFunction(
      () => {
        const t = document.querySelector("#turns .turn");
        return t && (t.querySelector(".verify").textContent.length > 0 || t.querySelector(".status .error"));
      },
      null,
      { timeout: 120000 },
    );
    out.answer = await page.textContent("#turns .turn .answer");
    out.verify = await page.textContent("#turns .turn .verify");
    await page.screenshot({ path: path.join(shots, "page-token-given.png"), fullPage: true });

    // Forget token: the head drops it.
    await page.click("#token-forget");
    await page.waitForSelector("#token-held", { state: "hidden" });
    const ring = await (await page.request.get(base + "/api/ring")).json();
    out.held_after_forget = ring.token_held;

    out.cookies = await context.cookies();
    out.document_cookie = await page.evaluate(() => document.cookie);
    out.storage = await page.evaluate(() => {
      const dump = (s) => Object.fromEntries(Array.from({ length: s.length }, (_, i) => [s.key(i), s.getItem(s.key(i))]));
      return { local: dump(localStorage), session: dump(sessionStorage) };
    });
    out.page_text = await page.textContent("body");
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
