// gpumem view: the page's own code. It reads the JSON that `gpumem view`
// embedded (the data layout is documented in crates/gpumem-cli/src/view.rs)
// and draws the summary table, the timeline and the side-by-side charts
// (with uPlot, inlined before this script) and the memory maps (as DOM
// elements, so each block can be hovered).
(function () {
  'use strict';

  const data = JSON.parse(document.getElementById('gpumem-data').textContent);
  const allocs = data.allocators;
  const tl = data.timeline;

  // ---- formatting -------------------------------------------------------

  const UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];

  function fmtBytes(b) {
    if (b === null || b === undefined || Number.isNaN(b)) return '-';
    let v = b;
    let i = 0;
    while (Math.abs(v) >= 1024 && i < UNITS.length - 1) {
      v /= 1024;
      i += 1;
    }
    return i === 0 ? `${Math.round(v)} B` : `${v.toFixed(2)} ${UNITS[i]}`;
  }

  function fmtCount(n) {
    return Math.round(n).toLocaleString('en-US');
  }

  function fmtMs(ms) {
    return ms >= 1000 ? `${(ms / 1000).toFixed(3)} s` : `${ms.toFixed(1)} ms`;
  }

  function hex(n) {
    return `0x${n.toString(16)}`;
  }

  function el(tag, attrs, text) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  }

  // ---- line styles: a colour and a dash per allocator ----------------------

  const COLORS = ['#1f77b4', '#ff7f0e', '#2ca02c', '#d62728', '#9467bd', '#8c564b', '#e377c2', '#17becf'];
  const DASHES = [[], [10, 5], [3, 3], [16, 4, 3, 4]];

  function lineStyle(i) {
    return { stroke: COLORS[i % COLORS.length], dash: DASHES[i % DASHES.length] };
  }

  function lineKey(i) {
    const s = lineStyle(i);
    const ns = 'http://www.w3.org/2000/svg';
    const svg = document.createElementNS(ns, 'svg');
    svg.setAttribute('width', '32');
    svg.setAttribute('height', '10');
    svg.setAttribute('class', 'line-key');
    const line = document.createElementNS(ns, 'line');
    line.setAttribute('x1', '0');
    line.setAttribute('y1', '5');
    line.setAttribute('x2', '32');
    line.setAttribute('y2', '5');
    line.setAttribute('stroke', s.stroke);
    line.setAttribute('stroke-width', '3');
    if (s.dash.length) line.setAttribute('stroke-dasharray', s.dash.join(' '));
    svg.appendChild(line);
    return svg;
  }

  // The unit the charts' y axes count in, from the largest value drawn.
  const yMax = Math.max(1, ...tl.live, ...tl.reserved.map((r) => Math.max(0, ...r)));
  const UNIT_POW = yMax >= 2 ** 30 ? 3 : yMax >= 2 ** 20 ? 2 : 1;
  const UNIT = 1024 ** UNIT_POW;
  const UNIT_NAME = UNITS[UNIT_POW];
  const inUnit = (arr) => arr.map((b) => (b === null ? null : b / UNIT));

  // ---- header, verdict and table -----------------------------------------

  function describeSource() {
    const s = data.source;
    const kind = s.kind === 'pytorch-snapshot' ? 'PyTorch memory snapshot' : 'RMM log';
    const skipped = s.skipped[0] + s.skipped[1] + s.skipped[2];
    let text = `${kind} ${s.path}: ${fmtCount(s.ops)} events replayed (${s.report})`;
    if (skipped) {
      text += `; skipped ${s.skipped[0]} failed allocations, ${s.skipped[1]} frees of unknown pointers, ${s.skipped[2]} zero-byte requests`;
    }
    text += `. Peak live ${fmtBytes(data.peak_live)} at event ${fmtCount(data.peak_live_op)}. Replayed on: ${data.device}.`;
    document.getElementById('source').textContent = text;
  }

  function verdict() {
    const replayed = allocs.filter((a) => a.replayed);
    if (!replayed.length) return;
    const sorted = [...replayed].sort((a, b) => a.peak_reserved - b.peak_reserved);
    const best = sorted[0];
    const worst = sorted[sorted.length - 1];
    let text = `The job uses at most ${fmtBytes(data.peak_live)} (live). `;
    text += `Leanest here: ${best.name}, holding ${fmtBytes(best.peak_reserved)} at its peak (${best.ratio.toFixed(2)}× the live peak)`;
    if (worst !== best) {
      text += `; ${worst.name} holds ${fmtBytes(worst.peak_reserved)} (${worst.ratio.toFixed(2)}×)`;
    }
    text += '.';
    const rec = allocs.find((a) => !a.replayed);
    if (rec) {
      text += ` PyTorch's own allocator, as recorded, held ${fmtBytes(rec.peak_reserved)} (${rec.ratio.toFixed(2)}×).`;
    }
    document.getElementById('verdict').textContent = text;
    return best;
  }

  function summaryTable(best) {
    const t = document.getElementById('summary');
    const head = el('tr');
    for (const h of ['allocator', 'peak live', 'peak reserved', 'at event', 'reserved / live', 'reserved at the end', 'driver allocations', 'driver frees', 'cuMemMap calls', 'what its map shows']) {
      head.appendChild(el('th', {}, h));
    }
    t.appendChild(head);
    allocs.forEach((a, i) => {
      const tr = el('tr', a === best ? { class: 'best' } : {});
      const name = el('td', { class: 'name' });
      name.appendChild(lineKey(i));
      name.appendChild(document.createTextNode(a.name));
      tr.appendChild(name);
      const known = (v) => (v === null || v === undefined ? 'n/a' : fmtCount(v));
      for (const v of [fmtBytes(data.peak_live), fmtBytes(a.peak_reserved), fmtCount(a.peak_op), a.ratio.toFixed(3), fmtBytes(a.final_reserved), known(a.driver_allocs), known(a.driver_frees), known(a.mappings)]) {
        tr.appendChild(el('td', {}, v));
      }
      tr.appendChild(el('td', { class: 'note' }, a.note));
      t.appendChild(tr);
    });
  }

  // ---- charts -------------------------------------------------------------

  const charts = [];
  let syncing = false;
  const xFull = [tl.x[0], tl.x[tl.x.length - 1]];

  function chartWidth() {
    return Math.max(400, document.getElementById('timeline').clientWidth || 1000);
  }

  // Keeps every chart's x range the same as the one just changed.
  function syncX(u) {
    if (syncing) return;
    syncing = true;
    const { min, max } = u.scales.x;
    for (const c of charts) {
      if (c !== u && (c.scales.x.min !== min || c.scales.x.max !== max)) c.setScale('x', { min, max });
    }
    syncing = false;
  }

  function setRange(min, max) {
    const span = xFull[1] - xFull[0];
    if (!(span > 0)) return; // one event: nothing to zoom
    let w = Math.min(Math.max(max - min, 2), span);
    let lo = Math.max(xFull[0], Math.min(min, xFull[1] - w));
    charts[0].setScale('x', { min: lo, max: lo + w });
  }

  // The pointer's x in the plotting area, in CSS pixels (offsetX would be
  // relative to whichever child element is under the pointer).
  function overX(u, e) {
    return e.clientX - u.over.getBoundingClientRect().left;
  }

  // Mouse wheel zoom around the pointer; Shift-drag (or middle-drag) pans.
  function addZoomPan(u) {
    u.over.addEventListener('wheel', (e) => {
      e.preventDefault();
      const { min, max } = u.scales.x;
      const at = u.posToVal(overX(u, e), 'x');
      const f = e.deltaY < 0 ? 0.75 : 1 / 0.75;
      setRange(at - (at - min) * f, at + (max - at) * f);
    }, { passive: false });
    u.root.addEventListener('mousedown', (e) => {
      if (!(e.shiftKey || e.button === 1) || !u.over.contains(e.target)) return;
      e.stopPropagation();
      e.preventDefault();
      const x0 = e.clientX;
      const { min, max } = u.scales.x;
      const perPx = (max - min) / u.over.clientWidth;
      const move = (m) => setRange(min - (m.clientX - x0) * perPx, max - (m.clientX - x0) * perPx);
      const up = () => {
        document.removeEventListener('mousemove', move);
        document.removeEventListener('mouseup', up);
      };
      document.addEventListener('mousemove', move);
      document.addEventListener('mouseup', up);
    }, true);
  }

  // Draws the moments with maps as ticks under the plot, the selected one
  // as a line across it.
  function momentsPlugin() {
    return {
      hooks: {
        draw: [(u) => {
          const ctx = u.ctx;
          const { left, top, width, height } = u.bbox;
          ctx.save();
          ctx.beginPath();
          ctx.rect(left, top, width, height);
          ctx.clip();
          ctx.fillStyle = 'rgba(0,0,0,0.35)';
          const tick = 6 * devicePixelRatio;
          for (const m of data.moments) {
            const x = u.valToPos(m.op, 'x', true);
            ctx.fillRect(x, top + height - tick, Math.max(1, devicePixelRatio), tick);
          }
          if (state.moment !== null) {
            const x = u.valToPos(data.moments[state.moment].op, 'x', true);
            ctx.strokeStyle = '#c00';
            ctx.lineWidth = 1.5 * devicePixelRatio;
            ctx.setLineDash([4 * devicePixelRatio, 3 * devicePixelRatio]);
            ctx.beginPath();
            ctx.moveTo(x, top);
            ctx.lineTo(x, top + height);
            ctx.stroke();
          }
          ctx.restore();
        }],
      },
    };
  }

  function bytesAxis(label) {
    return {
      label: `${label} (${UNIT_NAME})`,
      size: 70,
      values: (u, splits) => splits.map((v) => +v.toFixed(3)),
    };
  }

  const eventAxis = { label: 'event', values: (u, splits) => splits.map((v) => fmtCount(v)) };

  function timeline() {
    const series = [
      { label: 'event', value: (u, v) => (v === null ? '-' : fmtCount(v)) },
      { label: 'live', stroke: '#000', width: 1.5, value: (u, v) => (v === null ? '-' : fmtBytes(v * UNIT)) },
    ];
    allocs.forEach((a, i) => {
      const s = lineStyle(i);
      series.push({ label: `${a.name} reserved`, stroke: s.stroke, dash: s.dash, width: 2, value: (u, v) => (v === null ? '-' : fmtBytes(v * UNIT)) });
    });
    let drawn = false;
    const opts = {
      width: chartWidth(),
      height: 380,
      scales: { x: { time: false } },
      series,
      axes: [eventAxis, bytesAxis('memory')],
      cursor: { drag: { x: true, y: false }, sync: { key: 'gpumem', setSeries: false }, points: { show: false } },
      plugins: [momentsPlugin()],
      hooks: {
        setScale: [(u, key) => { if (key === 'x') syncX(u); }],
        setCursor: [(u) => readout(u.cursor.idx)],
        draw: [() => {
          if (drawn) return;
          drawn = true;
          window.gpumemView.timelineDrawnAt = performance.now();
          document.body.dataset.timeline = 'drawn';
        }],
      },
    };
    const u = new uPlot(opts, [tl.x, inUnit(tl.live), ...tl.reserved.map(inUnit)], document.getElementById('timeline'));
    addZoomPan(u);
    // A click (not a drag) picks the nearest moment with maps.
    let downX = null;
    u.over.addEventListener('mousedown', (e) => { downX = e.clientX; });
    u.over.addEventListener('mouseup', (e) => {
      if (downX !== null && Math.abs(e.clientX - downX) < 3 && !e.shiftKey) {
        selectMoment(nearestMoment(u.posToVal(overX(u, e), 'x')));
      }
      downX = null;
    });
    return u;
  }

  function readout(idx) {
    const out = document.getElementById('readout');
    if (idx === null || idx === undefined) return;
    const x = tl.x[idx];
    const live = tl.live[idx];
    const lines = [];
    const span = tl.bucket > 1 ? ` (a bucket of ${tl.bucket} events: each line's lowest and highest value in it)` : '';
    lines.push(`event ${fmtCount(x)}, ${fmtMs(tl.time_ms[idx])} into the log${span}`);
    lines.push(`  live ${fmtBytes(live)}`);
    allocs.forEach((a, i) => {
      const r = tl.reserved[i][idx];
      const ratio = live > 0 ? (r / live).toFixed(2) : '-';
      lines.push(`  ${a.name}: reserved ${fmtBytes(r)}, ${ratio}× live, ${fmtBytes(Math.max(0, r - live))} held beyond the live bytes`);
    });
    out.textContent = lines.join('\n');
  }

  function sideCharts() {
    const mk = (target, title, values, axis, fmt) => {
      const series = [{ label: 'event', value: (u, v) => (v === null ? '-' : fmtCount(v)) }];
      allocs.forEach((a, i) => {
        const s = lineStyle(i);
        series.push({ label: a.name, stroke: s.stroke, dash: s.dash, width: 1.5, spanGaps: false, value: (u, v) => (v === null || v === undefined ? '-' : fmt(v)) });
      });
      const u = new uPlot({
        title,
        width: chartWidth(),
        height: 190,
        scales: { x: { time: false } },
        series,
        axes: [eventAxis, axis],
        cursor: { drag: { x: true, y: false }, sync: { key: 'gpumem', setSeries: false }, points: { show: false } },
        hooks: { setScale: [(u2, key) => { if (key === 'x') syncX(u2); }] },
      }, [tl.at, ...values], document.getElementById(target));
      addZoomPan(u);
      return u;
    };
    charts.push(mk('ratio', 'reserved / live', tl.ratio, { label: 'ratio', size: 70 }, (v) => `${v.toFixed(3)}×`));
    charts.push(mk('hole', 'largest free block (largest hole)', tl.hole.map(inUnit), bytesAxis('largest hole'), (v) => fmtBytes(v * UNIT)));
  }

  // ---- moments and maps ---------------------------------------------------

  const state = { moment: null, sameScale: true };

  function nearestMoment(x) {
    let best = 0;
    for (let k = 1; k < data.moments.length; k += 1) {
      if (Math.abs(data.moments[k].op - x) < Math.abs(data.moments[best].op - x)) best = k;
    }
    return best;
  }

  // The row of the block table for the block allocated at event `op`
  // (the table is in event order), or -1.
  function blockIndex(op) {
    const ops = data.blocks.op;
    let lo = 0;
    let hi = ops.length - 1;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      if (ops[mid] === op) return mid;
      if (ops[mid] < op) lo = mid + 1; else hi = mid - 1;
    }
    return -1;
  }

  function blockInfo(op) {
    const i = blockIndex(op);
    if (i < 0) return null;
    return {
      op,
      free: data.blocks.free[i],
      size: data.blocks.size[i],
      stream: data.source.streams[data.blocks.stream[i]],
      stack: data.blocks.stack[i],
    };
  }

  function whatItDid(a, op) {
    const g = a.growth[String(op)];
    if (!a.replayed) {
      return g ? `PyTorch took ${g[0]} new segment(s) just before it (${fmtBytes(g[1])} more reserved)` : 'PyTorch served it from a segment it already held';
    }
    if (!g) return `${a.name} served it from memory it already held (a free block reused or split; no driver call)`;
    const parts = [];
    if (g[0]) parts.push(`${g[0]} driver allocation(s)`);
    if (g[2]) parts.push(`${g[2]} cuMemMap call(s)`);
    if (g[1]) parts.push(`reserve grew by ${fmtBytes(g[1])}`);
    if (a.kind === 'vpool') return `${a.name} mapped memory for it: ${parts.join(', ')}`;
    return `${a.name} grew for it: ${parts.join(', ')}`;
  }

  const STREAM_COLORS = ['#4a7bd0', '#e08a2e', '#3fa34d', '#c94c4c', '#8a6bc2', '#8c6d5a', '#d06fb0', '#2fb3c4'];

  // Builds an allocator's map as a tape of items in address order: blocks,
  // free stretches inside segments, and markers for the addresses between
  // segments. Positions are in bytes along the segments; the gaps take a
  // fixed number of pixels.
  function tapeItems(map) {
    const items = [];
    const segs = map.segs;
    const blocks = map.blocks;
    let b = 0;
    // Segment addresses travel as the gap from the previous segment's end.
    let prevEnd = 0;
    for (let s = 0; s * 3 < segs.length; s += 1) {
      const addr = prevEnd + segs[s * 3];
      const size = segs[s * 3 + 1];
      const flag = segs[s * 3 + 2];
      if (s > 0 && addr > prevEnd) {
        items.push({ kind: 'gap', addr: prevEnd, size: addr - prevEnd, mapped: flag === 1 && segs[s * 3 - 1] === 1 });
      }
      prevEnd = addr + size;
      items.push({ kind: 'seg', addr, size, flag });
      let at = addr;
      while (b * 4 < blocks.length && blocks[b * 4] === s) {
        const start = at + blocks[b * 4 + 1];
        const row = blockIndex(blocks[b * 4 + 3]);
        // Sizes travel as the difference from the size asked for.
        const bsize = (row < 0 ? 0 : data.blocks.size[row]) + blocks[b * 4 + 2];
        if (start > at) items.push({ kind: 'hole', addr: at, size: start - at, seg: s });
        items.push({ kind: flag === 2 ? 'unknown' : 'blk', addr: start, size: bsize, op: blocks[b * 4 + 3], seg: s });
        at = start + bsize;
        b += 1;
      }
      if (at < addr + size) items.push({ kind: 'hole', addr: at, size: addr + size - at, seg: s });
    }
    return items;
  }

  const GAP_PX = 8;
  const BASE_ROWS = 4;
  let mapItems = [];

  function renderMaps() {
    const k = state.moment;
    const m = data.moments[k];
    const box = document.getElementById('maps');
    box.textContent = '';
    const width = Math.max(300, box.clientWidth || 1000);
    const held = m.maps.map((mp) => {
      let sum = 0;
      for (let s = 1; s < mp.segs.length; s += 3) sum += mp.segs[s];
      return sum;
    });
    const maxHeld = Math.max(1, ...held);
    mapItems = [];
    m.maps.forEach((mp, i) => {
      const a = allocs[i];
      const div = el('div', { class: 'alloc-map', 'data-alloc': String(i) });
      const h = el('h3');
      h.appendChild(lineKey(i));
      h.appendChild(document.createTextNode(a.name));
      div.appendChild(h);
      const nBlocks = mp.blocks.length / 4;
      const nSegs = mp.segs.length / 3;
      div.appendChild(el('div', { class: 'figures' },
        `reserved ${fmtBytes(mp.reserved)} (${m.live ? (mp.reserved / m.live).toFixed(2) : '-'}× live); ` +
        `${fmtCount(nSegs)} segment(s) covering ${fmtBytes(held[i])}; ${fmtCount(nBlocks)} live block(s); ` +
        `largest free block ${a.layout ? fmtBytes(mp.largest_free) : 'unknown'}`));
      div.appendChild(el('p', { class: 'note' }, a.note));
      if (!a.layout) {
        div.appendChild(el('p', { class: 'no-layout' }, 'This allocator does not say where its free memory lies: only its live blocks are drawn, each as its own segment. This is not a layout.'));
      }
      const items = tapeItems(mp);
      mapItems.push(items);
      const bytes = state.sameScale ? maxHeld : Math.max(1, held[i]);
      const perPx = bytes / (width * BASE_ROWS);
      drawTape(div, items, perPx, width, i);
      box.appendChild(div);
    });
  }

  // Lays the tape out in rows of `width` pixels, splitting items at row ends.
  function drawTape(parent, items, perPx, width, alloc) {
    let pos = 0;
    const rows = [];
    const rowAt = (r) => {
      while (rows.length <= r) {
        const row = el('div', { class: 'map-row' });
        rows.push(row);
        parent.appendChild(row);
      }
      return rows[r];
    };
    items.forEach((it, j) => {
      if (it.kind === 'seg') {
        it.px = pos;
        const r = Math.floor(pos / width);
        const mark = el('div', { class: 'seg-start', 'data-alloc': String(alloc), 'data-item': String(j) });
        mark.style.left = `${pos - r * width}px`;
        mark.style.width = '0px';
        rowAt(r).appendChild(mark);
        return;
      }
      const len = it.kind === 'gap' ? GAP_PX : it.size / perPx;
      let p0 = pos;
      const p1 = pos + len;
      while (p0 < p1 - 1e-9) {
        const r = Math.floor(p0 / width + 1e-9);
        const rowEnd = (r + 1) * width;
        const end = Math.min(p1, rowEnd);
        const d = el('div', { class: it.kind, 'data-alloc': String(alloc), 'data-item': String(j) });
        if (it.op !== undefined) d.setAttribute('data-op', String(it.op));
        d.style.left = `${p0 - r * width}px`;
        d.style.width = `${Math.max(1, end - p0)}px`;
        if (it.kind === 'blk') {
          const row = blockIndex(it.op);
          const stream = row < 0 ? 0 : data.blocks.stream[row];
          d.style.background = STREAM_COLORS[stream % STREAM_COLORS.length];
        }
        rowAt(r).appendChild(d);
        p0 = end;
      }
      pos = p1;
    });
    if (!rows.length) rowAt(0);
  }

  function describeItem(alloc, it) {
    const a = allocs[alloc];
    const m = data.moments[state.moment];
    if (it.kind === 'gap') {
      return it.mapped
        ? `${a.name}: ${fmtBytes(it.size)} of unmapped addresses (${hex(it.addr)}…): reserved address space with no physical memory under it`
        : `${a.name}: ${fmtBytes(it.size)} of addresses between two segments (${hex(it.addr)}…), not held by the allocator`;
    }
    if (it.kind === 'hole') {
      if (a.kind === 'vpool') {
        return `${a.name}: ${fmtBytes(it.size)} mapped at ${hex(it.addr)} under no live block after event ${fmtCount(m.op)}: ` +
          'an idle mapping, whose physical pages may be an alias of memory a block uses elsewhere (the reserve counts physical memory once)';
      }
      return `${a.name}: free, ${fmtBytes(it.size)} at ${hex(it.addr)}: held from the driver, under no live block after event ${fmtCount(m.op)}`;
    }
    if (it.kind === 'seg') return `${a.name}: a segment of ${fmtBytes(it.size)} at ${hex(it.addr)}`;
    const info = blockInfo(it.op);
    const lines = [];
    lines.push(`${a.name}: live block at ${hex(it.addr)}, ${fmtBytes(it.size)} as the allocator holds it` + (info ? ` (${fmtBytes(info.size)} asked for)` : ''));
    if (it.kind === 'unknown') lines.push('outside every segment the allocator reported');
    if (info) {
      lines.push(`stream ${info.stream}`);
      lines.push(`allocated at event ${fmtCount(info.op)}` + (info.free === null ? '; never freed in the log' : `; freed at event ${fmtCount(info.free)} (lived ${fmtCount(info.free - info.op)} events)`));
      lines.push(whatItDid(a, info.op));
      if (info.stack !== null && data.stacks.stacks[info.stack]) {
        lines.push('stack (innermost first):');
        for (const f of data.stacks.stacks[info.stack]) lines.push(`  ${data.stacks.frames[f]}`);
      } else if (!data.source.has_stacks) {
        lines.push('(no stack: the log carries none; PyTorch snapshots do)');
      }
    }
    return lines.join('\n');
  }

  function hookMapHover() {
    const box = document.getElementById('maps');
    const tip = document.getElementById('tooltip');
    const details = document.getElementById('details');
    let lit = [];
    box.addEventListener('mouseover', (e) => {
      const t = e.target;
      if (!t.dataset || t.dataset.item === undefined) return;
      const alloc = Number(t.dataset.alloc);
      const it = mapItems[alloc][Number(t.dataset.item)];
      const text = describeItem(alloc, it);
      tip.textContent = text;
      tip.hidden = false;
      details.textContent = text;
      for (const x of lit) x.classList.remove('hl');
      lit = it.op !== undefined ? [...box.querySelectorAll(`[data-op="${it.op}"]`)] : [];
      for (const x of lit) x.classList.add('hl');
    });
    box.addEventListener('mousemove', (e) => {
      const pad = 14;
      const w = tip.offsetWidth;
      const x = e.clientX + pad + w > window.innerWidth ? e.clientX - pad - w : e.clientX + pad;
      tip.style.left = `${Math.max(0, x)}px`;
      tip.style.top = `${e.clientY + pad}px`;
    });
    box.addEventListener('mouseleave', () => {
      tip.hidden = true;
    });
  }

  function momentLabel(k) {
    const m = data.moments[k];
    const why = m.why.length ? ` — ${m.why.join(', ')}` : '';
    return `event ${fmtCount(m.op)} (${fmtMs(m.time_ms)})${why}`;
  }

  function selectMoment(k) {
    state.moment = Math.max(0, Math.min(data.moments.length - 1, k));
    const m = data.moments[state.moment];
    document.getElementById('map-title').textContent =
      `Memory map after event ${fmtCount(m.op)} (${fmtMs(m.time_ms)} into the log; live ${fmtBytes(m.live)})`;
    document.getElementById('moment-select').value = String(state.moment);
    renderMaps();
    for (const c of charts) c.redraw(false);
  }

  function momentControls() {
    const sel = document.getElementById('moment-select');
    data.moments.forEach((m, k) => sel.appendChild(el('option', { value: String(k) }, momentLabel(k))));
    sel.addEventListener('change', () => selectMoment(Number(sel.value)));
    document.getElementById('moment-prev').addEventListener('click', () => selectMoment(state.moment - 1));
    document.getElementById('moment-next').addEventListener('click', () => selectMoment(state.moment + 1));
    const same = document.getElementById('same-scale');
    same.addEventListener('change', () => {
      state.sameScale = same.checked;
      renderMaps();
    });
    const keys = data.moments.filter((m) => m.why.length).length;
    document.getElementById('map-help').textContent =
      `The page is static, so maps were taken at ${data.moments.length} moments only: ` +
      `${keys} key ones (each allocator's reserve peak, the live peak, the end of the log) and evenly spaced events ` +
      '(ticks under the timeline). A click on the timeline shows the nearest of them. ' +
      'Addresses run left to right, then on the next row; hover a block for its size, stream, events and what the allocator did for it; ' +
      'the same block is outlined in every allocator.';
  }

  function panButtons() {
    const pan = (f) => {
      const { min, max } = charts[0].scales.x;
      setRange(min + (max - min) * f, max + (max - min) * f);
    };
    document.getElementById('pan-left').addEventListener('click', () => pan(-0.25));
    document.getElementById('pan-right').addEventListener('click', () => pan(0.25));
    document.getElementById('zoom-out').addEventListener('click', () => {
      const { min, max } = charts[0].scales.x;
      const w = max - min;
      setRange(min - w / 2, max + w / 2);
    });
    document.getElementById('zoom-reset').addEventListener('click', () => setRange(xFull[0], xFull[1]));
  }

  function resize() {
    const w = chartWidth();
    for (const c of charts) c.setSize({ width: w, height: c.height });
    if (state.moment !== null) renderMaps();
  }

  // ---- start --------------------------------------------------------------

  window.gpumemView = { data, charts, timelineDrawnAt: null, readyAt: null, selectMoment, nearestMoment, state };
  describeSource();
  summaryTable(verdict());
  if (tl.bucket > 1) {
    document.getElementById('downsampled').textContent =
      `The timeline keeps, for each run of ${tl.bucket} events, each line's lowest and highest value, so no peak is lost; the maps below are exact.`;
  }
  charts.push(timeline());
  sideCharts();
  momentControls();
  panButtons();
  hookMapHover();
  // Start at the first allocator's reserve peak.
  const start = allocs.length ? allocs[0].peak_op : data.peak_live_op;
  selectMoment(nearestMoment(start));
  let resizeTimer = null;
  window.addEventListener('resize', () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(resize, 150);
  });
  window.gpumemView.readyAt = performance.now();
  window.gpumemView.ready = true;
}());
