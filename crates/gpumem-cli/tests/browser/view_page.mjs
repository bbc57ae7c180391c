// Opens a page made by `gpumem view` in headless Chromium and checks it as a
// person would use it: no console or page errors, the timeline drawn, a
// click on the timeline shows the memory maps of the nearest moment, a
// hovered block shows its details. Takes screenshots and measures how long
// the page takes to draw its timeline.
//
//   node view_page.mjs PAGE.html [--shots DIR] [--name NAME] [--stacks] [--doc-shot FILE]
//
// --shots DIR (or $VIEW_SHOTS): where screenshots go (default: none).
// --doc-shot FILE: also a smaller picture for the guide (docs/viewer.png):
// 1100 pixels wide, the side-by-side charts and the footer left out.
// --stacks: the page was made from a PyTorch snapshot; blocks must carry
// stack traces and PyTorch's own allocator must be shown.
// The browser is $CHROMIUM or /usr/bin/chromium (Debian's package).
//
// Prints one line per check and ends with "N passed, M failed"; exits 1 if
// any check failed.

import { mkdtempSync, mkdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve, basename } from 'node:path';
import { pathToFileURL } from 'node:url';
import { chromium } from 'playwright-core';

function parseArgs(argv) {
  const out = { page: null, shots: process.env.VIEW_SHOTS || null, name: null, stacks: false, doc: null };
  for (let i = 0; i < argv.length; i += 1) {
    const a = argv[i];
    if (a === '--shots') out.shots = argv[(i += 1)];
    else if (a === '--name') out.name = argv[(i += 1)];
    else if (a === '--stacks') out.stacks = true;
    else if (a === '--doc-shot') out.doc = argv[(i += 1)];
    else if (!out.page) out.page = a;
    else throw new Error(`unexpected argument ${a}`);
  }
  if (!out.page) throw new Error('usage: node view_page.mjs PAGE.html [--shots DIR] [--name NAME] [--stacks]');
  out.name = out.name || basename(out.page).replace(/\.html?$/, '');
  return out;
}

const args = parseArgs(process.argv.slice(2));
let passed = 0;
let failed = 0;

function check(what, ok, detail = '') {
  if (ok) passed += 1; else failed += 1;
  console.log(`${ok ? 'ok  ' : 'FAIL'} ${what}${detail ? `: ${detail}` : ''}`);
}

// A fresh profile, and the flags that keep Chromium off the network: without
// the background-networking ones it keeps trying to reach Google's services.
const profile = mkdtempSync(join(tmpdir(), 'gpumem-view-chromium-'));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  headless: true,
  args: [
    '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync',
  ],
  viewport: { width: 1400, height: 1000 },
  deviceScaleFactor: 1,
});

const errors = [];
const requests = [];
try {
  const page = context.pages()[0] || await context.newPage();
  page.on('console', (m) => { if (m.type() === 'error') errors.push(`console: ${m.text()}`); });
  page.on('pageerror', (e) => errors.push(`page error: ${e.message}`));
  page.on('request', (r) => { if (!r.url().startsWith('file:')) requests.push(r.url()); });

  const url = pathToFileURL(resolve(args.page)).href;
  const t0 = Date.now();
  await page.goto(url, { waitUntil: 'load', timeout: 120000 });
  await page.waitForFunction(() => document.body.dataset.timeline === 'drawn', null, { timeout: 120000 });
  const wall = Date.now() - t0;
  await page.waitForFunction(() => window.gpumemView.ready === true, null, { timeout: 120000 });
  const { drawnAt, readyAt } = await page.evaluate(() => ({
    drawnAt: window.gpumemView.timelineDrawnAt,
    readyAt: window.gpumemView.readyAt,
  }));
  console.log(`open: timeline drawn ${drawnAt.toFixed(0)} ms after navigation started, ` +
    `maps drawn at ${readyAt.toFixed(0)} ms (${wall} ms from goto to the timeline)`);

  // The timeline: a canvas of a sane size, one line per allocator plus live.
  const canvas = await page.$('#timeline canvas');
  const box = canvas && await canvas.boundingBox();
  check('timeline canvas drawn', box && box.width > 300 && box.height > 200, box ? `${box.width}x${box.height}` : 'no canvas');
  const info = await page.evaluate(() => ({
    allocators: window.gpumemView.data.allocators.map((a) => a.name),
    series: window.gpumemView.charts[0].series.length,
    moments: window.gpumemView.data.moments.length,
  }));
  check('one line per allocator, plus live', info.series === info.allocators.length + 2, `${info.series} series for ${info.allocators.join(', ')}`);
  check('side-by-side charts drawn', (await page.$$('#ratio canvas, #hole canvas')).length === 2);
  check('summary table has a row per allocator', (await page.$$('#summary tr')).length === info.allocators.length + 1);

  // Hovering the timeline shows the figures at that moment.
  const over = await page.$('#timeline .u-over');
  const ob = await over.boundingBox();
  await page.mouse.move(ob.x + ob.width * 0.5, ob.y + ob.height * 0.5);
  const readout = await page.textContent('#readout');
  check('hovering the timeline shows the figures', /live .*\n.*reserved/.test(readout), readout.split('\n')[0]);

  // A click on the timeline picks the nearest moment with maps.
  const clickAt = async (op) => {
    await over.scrollIntoViewIfNeeded();
    const b = await over.boundingBox();
    const x = await page.evaluate((v) => window.gpumemView.charts[0].valToPos(v, 'x'), op);
    await page.mouse.click(b.x + x, b.y + b.height * 0.6);
  };
  const quarter = await page.evaluate(() => {
    const x = window.gpumemView.data.timeline.x;
    return x[Math.floor(x.length / 4)];
  });
  await clickAt(quarter);
  const picked = await page.evaluate((v) => ({
    expected: window.gpumemView.nearestMoment(v),
    selected: window.gpumemView.state.moment,
  }), quarter);
  check('a click on the timeline selects the nearest moment', picked.expected === picked.selected, JSON.stringify(picked));
  const peak = await page.evaluate(() => window.gpumemView.data.allocators[0].peak_op);
  // Zoomed in around the peak so that a pixel spans at most one event: on a
  // long log one pixel spans hundreds, and the moment nearest to it can be
  // another key moment beside the peak (the live peak). The whole log again
  // afterwards.
  const full = await page.evaluate((p) => {
    const u = window.gpumemView.charts[0];
    const was = [u.scales.x.min, u.scales.x.max];
    const half = u.bbox.width / devicePixelRatio / 2;
    u.setScale('x', { min: Math.max(was[0], p - half), max: Math.min(was[1], p + half) });
    return was;
  }, peak);
  await clickAt(peak);
  const title = await page.textContent('#map-title');
  const atPeak = await page.evaluate(() => {
    const v = window.gpumemView;
    return v.data.moments[v.state.moment].why.some((w) => w.startsWith(`peak reserved of ${v.data.allocators[0].name}`));
  });
  check('clicking the peak shows the map at the peak', atPeak, title);
  await page.evaluate(([min, max]) => window.gpumemView.charts[0].setScale('x', { min, max }), full);
  const maps = await page.$$('#maps .alloc-map');
  check('a map per allocator', maps.length === info.allocators.length, `${maps.length}`);
  const blocks = await page.$$('#maps .blk');
  check('maps show live blocks', blocks.length > 0, `${blocks.length} block elements`);
  check('maps show free holes or segments', (await page.$$('#maps .hole, #maps .seg-start')).length > 0);

  // Hovering a block shows its details.
  let hovered = null;
  for (const b of blocks) {
    const bb = await b.boundingBox();
    if (bb && bb.width >= 3 && bb.y > 0) {
      await b.scrollIntoViewIfNeeded();
      await b.hover();
      hovered = b;
      break;
    }
  }
  const tip = await page.$('#tooltip');
  const tipText = hovered ? await tip.textContent() : '';
  check('hovering a block shows its details', hovered && await tip.isVisible() && /allocated at event/.test(tipText) && /stream/.test(tipText), tipText.split('\n').slice(0, 2).join(' | '));
  check('the details say what the allocator did', /served it from memory|grew for it|mapped memory for it|PyTorch/.test(tipText));
  if (args.stacks) {
    check('blocks carry stack traces', /stack \(innermost first\)/.test(tipText));
    check("PyTorch's own allocator is shown", info.allocators.includes('pytorch (recorded)'));
  }

  // Zoom with the wheel, then pan with the buttons.
  await page.evaluate(() => window.scrollTo(0, 0));
  const before = await page.evaluate(() => { const s = window.gpumemView.charts[0].scales.x; return [s.min, s.max]; });
  const ob2 = await over.boundingBox();
  await page.mouse.move(ob2.x + ob2.width / 2, ob2.y + ob2.height / 2);
  await page.mouse.wheel(0, -300);
  const zoomed = await page.evaluate(() => { const s = window.gpumemView.charts[0].scales.x; return [s.min, s.max]; });
  check('the wheel zooms in', zoomed[1] - zoomed[0] < before[1] - before[0], `${before} -> ${zoomed}`);
  await page.click('#pan-right');
  const panned = await page.evaluate(() => { const s = window.gpumemView.charts[0].scales.x; return [s.min, s.max]; });
  check('the pan button moves the range', panned[0] > zoomed[0], `${zoomed} -> ${panned}`);
  const side = await page.evaluate(() => { const s = window.gpumemView.charts[1].scales.x; return [s.min, s.max]; });
  check('the side charts follow the timeline', Math.abs(side[0] - panned[0]) < 1e-6 && Math.abs(side[1] - panned[1]) < 1e-6);
  await page.click('#zoom-reset');

  if (args.shots) {
    mkdirSync(args.shots, { recursive: true });
    // The timeline and the map at the peak, as a person sees them.
    await clickAt(peak);
    await page.mouse.move(0, 0);
    await page.evaluate(() => window.scrollTo(0, 0));
    const shot = join(args.shots, `${args.name}.png`);
    await page.screenshot({ path: shot, fullPage: true });
    const timelineShot = join(args.shots, `${args.name}-timeline.png`);
    await (await page.$('#timeline-section')).screenshot({ path: timelineShot });
    const mapShot = join(args.shots, `${args.name}-map.png`);
    await (await page.$('#map-section')).screenshot({ path: mapShot });
    console.log(`screenshots: ${shot}, ${timelineShot}, ${mapShot}`);
  }

  if (args.doc) {
    await page.setViewportSize({ width: 1100, height: 800 });
    await page.addStyleTag({ content: '#side-section, footer { display: none; }' });
    await page.waitForTimeout(400); // the charts follow the width after a pause
    await clickAt(peak);
    await page.mouse.move(0, 0);
    await page.screenshot({ path: args.doc, fullPage: true });
    console.log(`guide picture: ${args.doc}`);
  }

  check('no console or page errors', errors.length === 0, errors.slice(0, 5).join(' | '));
  check('no network requests', requests.length === 0, requests.slice(0, 5).join(' '));
} catch (e) {
  check('the page could be driven', false, e.stack || String(e));
} finally {
  await context.close();
  rmSync(profile, { recursive: true, force: true });
}

console.log(`page ${args.name}`);
console.log(`browser: ${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
