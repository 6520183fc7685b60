/* The timeline of areal-graph runs, drawn on a canvas from the JSON block #data (payload.py).
 *
 * Why a canvas and not one DOM element per span: tens of thousands of spans must pan and zoom
 * smoothly. Spans are kept per row, sorted by start, so a frame touches only what is in view,
 * and spans narrower than a pixel are drawn once per pixel column. After every frame the counts
 * of what was drawn are written to <body data-...> (the tests read them), and any error goes
 * into #errors (data-count) instead of only the console.
 */
(function () {
  'use strict';
  var ROW_H = 14, FOLDED_H = 4 * ROW_H, RUN_H = 24, PROC_H = 18, TRACK_GAP = 2, AXIS_H = 26, GUTTER = 210;
  var FOLD_OVER = 8;  // tracks with more lanes start folded

  var errors = document.getElementById('errors');
  function reportError(msg) {
    errors.hidden = false;
    var line = document.createElement('div');
    line.textContent = msg;
    errors.appendChild(line);
    errors.dataset.count = String(Number(errors.dataset.count) + 1);
    document.body.dataset.status = 'error';
  }
  window.addEventListener('error', function (e) { reportError('error: ' + (e.message || e)); });

  // ------------------------------------------------------------------ data
  function prepareRun(p, index) {
    var s = p.spans, n = s.t.length, run = {
      index: index, label: p.label, p: p, n: n, duration: p.duration_ms, firstStep: p.first_step_ms,
      t: Float64Array.from(s.t), d: Float64Array.from(s.d), r: Int32Array.from(s.r), name: Int32Array.from(s.n),
      col: Int32Array.from(s.c), args: Int32Array.from(s.a), node: Int32Array.from(s.k), flag: Int32Array.from(s.f),
      colours: p.colours.map(function (c) { return c.colour; }), tracks: p.tracks, flows: p.flows,
      rows: 0, rowSpans: [], rowMaxDur: [], rowTrack: [], spanFlows: {}
    };
    p.tracks.forEach(function (tr, ti) {
      tr.folded = tr.rows > FOLD_OVER;
      for (var k = 0; k < tr.rows; k++) { run.rowTrack[tr.row0 + k] = ti; }
      run.rows = Math.max(run.rows, tr.row0 + tr.rows);
    });
    for (var row = 0; row < run.rows; row++) { run.rowSpans.push([]); run.rowMaxDur.push(0); }
    for (var i = 0; i < n; i++) {
      run.rowSpans[run.r[i]].push(i);
      if (run.d[i] > run.rowMaxDur[run.r[i]]) { run.rowMaxDur[run.r[i]] = run.d[i]; }
    }
    run.rowSpans = run.rowSpans.map(function (list) {
      list.sort(function (a, b) { return run.t[a] - run.t[b]; });
      return Int32Array.from(list);
    });
    p.flows.forEach(function (f, fi) {
      [f[4], f[5]].forEach(function (si) {
        if (si >= 0) { (run.spanFlows[si] = run.spanFlows[si] || []).push(fi); }
      });
    });
    return run;
  }

  // ------------------------------------------------------------------ state
  var data = JSON.parse(document.getElementById('data').textContent);
  var runs = data.runs.map(prepareRun);
  var canvas = document.getElementById('timeline'), ctx = canvas.getContext('2d');
  var card = document.getElementById('card');
  var view = { start: 0, end: 1, scrollY: 0, align: 'start', flows: true };
  var layout = { rows: [], labels: [], height: 0 };
  var hover = null;      // {run, span}
  var picked = null;     // {run, node name index}: spans of one graph node
  var W = 0, H = 0;

  function offset(run) { return view.align === 'step' ? run.firstStep : 0; }
  function fullRange() {
    var end = 1;
    runs.forEach(function (r) { end = Math.max(end, r.duration - offset(r)); });
    var start = 0;
    runs.forEach(function (r) { start = Math.min(start, -offset(r)); });
    return [start, end];
  }
  function resetView() {
    var range = fullRange(), pad = (range[1] - range[0]) * 0.01;
    view.start = range[0] - pad; view.end = range[1] + pad; view.scrollY = 0;
  }

  // ------------------------------------------------------------------ layout (rows' y)
  function computeLayout() {
    var y = 0, rows = [], labels = [];
    runs.forEach(function (run) {
      labels.push({ y: y, h: RUN_H, text: run.label + '  (' + fmtMs(run.duration) + ')', kind: 'run', run: run });
      y += RUN_H;
      run.rowY = new Float64Array(run.rows); run.rowH = new Float64Array(run.rows);
      var lastProc = null;
      run.tracks.forEach(function (tr, ti) {
        if (tr.process !== lastProc) {
          labels.push({ y: y, h: PROC_H, text: tr.process, kind: 'process', run: run });
          y += PROC_H; lastProc = tr.process;
        }
        var folded = tr.folded, h = folded ? FOLDED_H / tr.rows : ROW_H, top = y;
        for (var k = 0; k < tr.rows; k++) {
          run.rowY[tr.row0 + k] = y; run.rowH[tr.row0 + k] = h;
          rows.push({ run: run, row: tr.row0 + k, y: y, h: h });
          y += h;
        }
        var text = tr.name + (tr.rows > 1 ? (folded ? '  \u25B8 ' : '  \u25BE ') + tr.rows + ' lanes' : '');
        labels.push({ y: top, h: y - top, text: text, kind: 'track', run: run, track: ti });
        y += TRACK_GAP;
      });
    });
    layout = { rows: rows, labels: labels, height: y };
  }

  // ------------------------------------------------------------------ coordinates
  function scale() { return (W - GUTTER) / (view.end - view.start); }
  function xOf(run, t) { return GUTTER + (t - offset(run) - view.start) * scale(); }
  function tOf(run, x) { return (x - GUTTER) / scale() + view.start + offset(run); }
  function yOf(y) { return y - view.scrollY + AXIS_H; }

  function firstIndex(run, row, tFrom) {
    var list = run.rowSpans[row], lo = 0, hi = list.length, from = tFrom - run.rowMaxDur[row];
    while (lo < hi) { var mid = (lo + hi) >> 1; if (run.t[list[mid]] < from) { lo = mid + 1; } else { hi = mid; } }
    return lo;
  }

  // ------------------------------------------------------------------ drawing
  function draw() {
    var stats = { spans: 0, flows: 0, instants: 0 }, started = performance.now();
    ctx.setTransform(window.devicePixelRatio || 1, 0, 0, window.devicePixelRatio || 1, 0, 0);
    ctx.clearRect(0, 0, W, H);
    ctx.save();
    ctx.beginPath(); ctx.rect(0, AXIS_H, W, H - AXIS_H); ctx.clip();
    drawBands();
    runs.forEach(function (run) { drawSpans(run, stats); drawCounters(run); drawInstants(run, stats); });
    if (view.flows) { runs.forEach(function (run) { drawFlows(run, stats); }); }
    drawHover();
    ctx.restore();
    drawGutter();
    drawAxis();
    var b = document.body.dataset;
    b.spansDrawn = String(stats.spans); b.flowsDrawn = String(stats.flows); b.instantsDrawn = String(stats.instants);
    b.viewStart = view.start.toFixed(3); b.viewEnd = view.end.toFixed(3); b.scrollY = String(view.scrollY);
    b.drawMs = (performance.now() - started).toFixed(1);
  }

  function drawBands() {
    layout.labels.forEach(function (l, i) {
      var y = yOf(l.y);
      if (y > H || y + l.h < AXIS_H) { return; }
      if (l.kind === 'run') { ctx.fillStyle = '#e2e8f0'; ctx.fillRect(0, y, W, l.h); }
      else if (l.kind === 'process') { ctx.fillStyle = '#f1f5f9'; ctx.fillRect(0, y, W, l.h); }
      else if (l.kind === 'track' && i % 2 === 0) { ctx.fillStyle = '#fafafa'; ctx.fillRect(GUTTER, y, W, l.h); }
    });
  }

  function drawSpans(run, stats) {
    var t0 = tOf(run, GUTTER), t1 = tOf(run, W), sc = scale(), dim = picked && picked.run === run;
    ctx.font = '11px system-ui, sans-serif'; ctx.textBaseline = 'middle';
    for (var row = 0; row < run.rows; row++) {
      var y = yOf(run.rowY[row]), h = run.rowH[row];
      if (y > H || y + h < AXIS_H) { continue; }
      var list = run.rowSpans[row], lastPx = -1, rh = Math.max(h - (h > 3 ? 1 : 0), 1);
      for (var j = firstIndex(run, row, t0); j < list.length; j++) {
        var i = list[j], t = run.t[i];
        if (t > t1) { break; }
        if (t + run.d[i] < t0) { continue; }
        var x0 = xOf(run, t), w = run.d[i] * sc;
        if (w < 1) {
          var px = Math.floor(x0);
          if (px === lastPx) { continue; }
          lastPx = px; x0 = px; w = 1;
        } else { lastPx = Math.floor(x0 + w); }
        ctx.globalAlpha = dim && run.node[i] !== picked.node ? 0.18 : (run.flag[i] & 2 ? 0.55 : 1);
        ctx.fillStyle = run.colours[run.col[i]];
        ctx.fillRect(x0, y, w, rh);
        stats.spans++;
        if (run.flag[i] & 1) { drawOpenEdge(x0 + w, y, rh); }
        if (w > 40 && h >= ROW_H) { drawLabel(run, i, x0, y, w, rh); }
      }
    }
    ctx.globalAlpha = 1;
  }

  function drawOpenEdge(x, y, h) {  // a span that never ended: a red zigzag at its (assumed) end
    ctx.save(); ctx.globalAlpha = 1; ctx.strokeStyle = '#dc2626'; ctx.lineWidth = 2; ctx.beginPath();
    for (var k = 0; k <= 4; k++) { ctx.lineTo(x + (k % 2 ? -3 : 0), y + h * k / 4); }
    ctx.stroke(); ctx.restore();
  }

  function drawLabel(run, i, x0, y, w, h) {
    var left = Math.max(x0, GUTTER) + 3, right = Math.min(x0 + w, W) - 3;
    if (right - left < 30) { return; }
    ctx.save(); ctx.beginPath(); ctx.rect(left, y, right - left, h); ctx.clip();
    ctx.fillStyle = '#0f172a'; ctx.globalAlpha = 0.85;
    ctx.fillText(run.p.names[run.name[i]], left, y + h / 2);
    ctx.restore();
  }

  function flowEnd(run, f, k) {  // k = 0: tail, 1: head
    var row = f[1 + 2 * k];
    return [xOf(run, f[2 * k]), yOf(run.rowY[row] + run.rowH[row] / 2)];
  }

  function drawFlows(run, stats) {
    ctx.lineWidth = 1; ctx.strokeStyle = 'rgba(30, 41, 59, 0.55)'; ctx.fillStyle = 'rgba(30, 41, 59, 0.7)';
    run.flows.forEach(function (f) {
      var a = flowEnd(run, f, 0), b = flowEnd(run, f, 1);
      if ((a[0] < GUTTER && b[0] < GUTTER) || (a[0] > W && b[0] > W)) { return; }
      if ((a[1] < AXIS_H && b[1] < AXIS_H) || (a[1] > H && b[1] > H)) { return; }
      arrow(a, b);
      stats.flows++;
    });
  }

  function arrow(a, b) {
    var mx = (a[0] + b[0]) / 2;
    ctx.beginPath(); ctx.moveTo(a[0], a[1]);
    ctx.bezierCurveTo(mx, a[1], mx, b[1], b[0], b[1]); ctx.stroke();
    var ang = Math.atan2(b[1] - a[1], (b[0] - mx) || 1e-6) * 0.5;
    ctx.beginPath(); ctx.moveTo(b[0], b[1]);
    ctx.lineTo(b[0] - 7 * Math.cos(ang - 0.4), b[1] - 7 * Math.sin(ang - 0.4));
    ctx.lineTo(b[0] - 7 * Math.cos(ang + 0.4), b[1] - 7 * Math.sin(ang + 0.4));
    ctx.closePath(); ctx.fill();
  }

  function drawInstants(run, stats) {
    var top = null, bottom = null;
    layout.labels.forEach(function (l) {
      if (l.run === run) { top = top === null ? l.y : Math.min(top, l.y); bottom = Math.max(bottom || 0, l.y + l.h); }
    });
    run.p.instants.forEach(function (e) {
      var x = xOf(run, e[0]);
      if (x < GUTTER || x > W) { return; }
      ctx.fillStyle = '#b91c1c'; ctx.strokeStyle = 'rgba(185, 28, 28, 0.6)';
      if (e[1] < 0) {
        ctx.setLineDash([4, 3]); ctx.beginPath(); ctx.moveTo(x, yOf(top)); ctx.lineTo(x, yOf(bottom)); ctx.stroke();
        ctx.setLineDash([]);
      } else {
        var y = yOf(run.rowY[e[1]]);
        ctx.beginPath(); ctx.moveTo(x - 4, y); ctx.lineTo(x + 4, y); ctx.lineTo(x, y + 7); ctx.closePath(); ctx.fill();
      }
      stats.instants++;
    });
  }

  function drawCounters(run) {
    run.p.counters.forEach(function (c) {
      var y = yOf(run.rowY[c.row]), h = run.rowH[c.row];
      Object.keys(c.series).forEach(function (name, si) {
        var pts = c.series[name], max = 0, lastY = null;
        pts.forEach(function (p) { max = Math.max(max, Math.abs(p[1])); });
        ctx.strokeStyle = ['#0ea5e9', '#f97316', '#22c55e', '#a855f7'][si % 4]; ctx.beginPath();
        pts.forEach(function (p) {  // a step line: each value holds until the next sample
          var x = xOf(run, p[0]), yy = y + h - (max ? p[1] / max : 0) * (h - 2);
          if (lastY !== null) { ctx.lineTo(x, lastY); }
          ctx.lineTo(x, yy); lastY = yy;
        });
        ctx.stroke();
      });
    });
  }

  function drawHover() {
    if (!hover) { return; }
    var run = hover.run, i = hover.span, row = run.r[i];
    var x0 = xOf(run, run.t[i]), w = Math.max(run.d[i] * scale(), 1), y = yOf(run.rowY[row]);
    ctx.lineWidth = 2; ctx.strokeStyle = '#0f172a'; ctx.strokeRect(x0, y, w, Math.max(run.rowH[row] - 1, 2));
    ctx.lineWidth = 2; ctx.strokeStyle = '#dc2626'; ctx.fillStyle = '#dc2626';
    (run.spanFlows[i] || []).forEach(function (fi) {
      var f = run.flows[fi];
      arrow(flowEnd(run, f, 0), flowEnd(run, f, 1));
    });
  }

  function drawGutter() {
    ctx.fillStyle = '#fff'; ctx.fillRect(0, AXIS_H, GUTTER, H);
    ctx.save(); ctx.beginPath(); ctx.rect(0, AXIS_H, GUTTER, H - AXIS_H); ctx.clip();
    ctx.textBaseline = 'middle';
    layout.labels.forEach(function (l) {
      var y = yOf(l.y);
      if (y > H || y + l.h < AXIS_H) { return; }
      if (l.kind === 'run') {
        ctx.fillStyle = '#cbd5e1'; ctx.fillRect(0, y, GUTTER, l.h);
        ctx.font = 'bold 12px system-ui, sans-serif'; ctx.fillStyle = '#0f172a'; ctx.fillText(l.text, 6, y + l.h / 2);
      } else if (l.kind === 'process') {
        ctx.fillStyle = '#f1f5f9'; ctx.fillRect(0, y, GUTTER, l.h);
        ctx.font = 'bold 11px system-ui, sans-serif'; ctx.fillStyle = '#334155'; ctx.fillText(l.text, 6, y + l.h / 2);
      } else {
        ctx.font = '11px system-ui, sans-serif'; ctx.fillStyle = '#334155';
        ctx.fillText(l.text, 16, y + Math.min(l.h, ROW_H) / 2);
      }
    });
    ctx.restore();
    ctx.strokeStyle = '#cbd5e1'; ctx.beginPath(); ctx.moveTo(GUTTER + 0.5, AXIS_H); ctx.lineTo(GUTTER + 0.5, H); ctx.stroke();
  }

  function drawAxis() {
    ctx.fillStyle = '#f8fafc'; ctx.fillRect(0, 0, W, AXIS_H);
    var span = view.end - view.start, target = span / Math.max((W - GUTTER) / 110, 1);
    var p = Math.pow(10, Math.floor(Math.log10(target))), step = p;
    [1, 2, 5, 10].some(function (m) { step = m * p; return m * p >= target; });
    ctx.fillStyle = '#334155'; ctx.strokeStyle = '#cbd5e1'; ctx.font = '11px system-ui, sans-serif';
    ctx.textBaseline = 'top';
    for (var t = Math.ceil(view.start / step) * step; t <= view.end; t += step) {
      var x = GUTTER + (t - view.start) * scale();
      ctx.beginPath(); ctx.moveTo(x + 0.5, AXIS_H - 8); ctx.lineTo(x + 0.5, H); ctx.globalAlpha = 0.35; ctx.stroke();
      ctx.globalAlpha = 1; ctx.fillText(fmtMs(t, step), x + 3, 6);
    }
    ctx.fillStyle = '#64748b';
    ctx.fillText(view.align === 'step' ? 'time from each run\u2019s first step' : 'time from each run\u2019s start', 6, 6);
    ctx.strokeStyle = '#94a3b8'; ctx.beginPath(); ctx.moveTo(0, AXIS_H - 0.5); ctx.lineTo(W, AXIS_H - 0.5); ctx.stroke();
  }

  function fmtMs(ms, step) {
    // A duration or time in milliseconds; with `step` (an axis tick spacing) as many decimals as it needs.
    function decimals(unitMs) { return step === undefined ? 2 : Math.max(0, Math.ceil(-Math.log10(step / unitMs) - 1e-9)); }
    var a = Math.abs(step === undefined ? ms : step * 10);
    if (a >= 1000) { return (ms / 1000).toFixed(decimals(1000)) + ' s'; }
    if (a >= 1) { return ms.toFixed(decimals(1)) + ' ms'; }
    return (ms * 1000).toFixed(step === undefined ? 0 : decimals(0.001)) + ' \u00B5s';
  }

  // ------------------------------------------------------------------ hover card
  function rowAt(y) {
    var cy = y - AXIS_H + view.scrollY, rows = layout.rows, lo = 0, hi = rows.length - 1;
    while (lo <= hi) {
      var mid = (lo + hi) >> 1, r = rows[mid];
      if (cy < r.y) { hi = mid - 1; } else if (cy >= r.y + r.h) { lo = mid + 1; } else { return r; }
    }
    return null;
  }

  function spanAt(x, y) {
    var hit = rowAt(y);
    if (!hit || x < GUTTER) { return null; }
    var run = hit.run, t = tOf(run, x), slack = 3 / scale(), list = run.rowSpans[hit.row], best = -1;
    for (var j = firstIndex(run, hit.row, t - slack); j < list.length; j++) {
      var i = list[j];
      if (run.t[i] > t + slack) { break; }
      if (run.t[i] + run.d[i] + slack >= t && (best < 0 || run.d[i] < run.d[best])) { best = i; }
    }
    return best < 0 ? null : { run: run, span: best };
  }

  function showCard(h, x, y) {
    var run = h.run, i = h.span, tr = run.tracks[run.rowTrack[run.r[i]]], args = run.p.args[run.args[i]] || {};
    var rows = [['run', run.label], ['where', tr.process + ' \u203A ' + tr.name],
      ['start', fmtMs(run.t[i] - offset(run))], ['duration', fmtMs(run.d[i])]];
    if (run.flag[i] & 1) { rows.push(['unterminated', 'never ended: drawn to the end of its file']); }
    Object.keys(args).forEach(function (k) {
      var v = typeof args[k] === 'string' ? args[k] : JSON.stringify(args[k]);
      rows.push([k, v.length > 240 ? v.slice(0, 240) + '\u2026' : v]);
    });
    if (run.spanFlows[i]) { rows.push(['flows', String(run.spanFlows[i].length)]); }
    card.innerHTML = '';
    var h5 = document.createElement('h5'); h5.textContent = run.p.names[run.name[i]]; card.appendChild(h5);
    var table = document.createElement('table');
    rows.forEach(function (r) {
      var tr2 = table.insertRow(); tr2.insertCell().textContent = r[0]; tr2.insertCell().textContent = r[1];
    });
    card.appendChild(table);
    card.hidden = false;
    var box = canvas.getBoundingClientRect();
    card.style.left = Math.min(x + 14, box.width - card.offsetWidth - 4) + 'px';
    card.style.top = Math.min(y + 14, box.height - card.offsetHeight - 4) + 'px';
  }

  // ------------------------------------------------------------------ interaction
  function resize() {
    var box = canvas.getBoundingClientRect(), dpr = window.devicePixelRatio || 1;
    W = Math.max(box.width, 300); H = Math.max(box.height, 200);
    canvas.width = Math.round(W * dpr); canvas.height = Math.round(H * dpr);
    draw();
  }

  function clampScroll() {
    view.scrollY = Math.max(0, Math.min(view.scrollY, Math.max(0, layout.height - (H - AXIS_H) + 10)));
  }

  function zoomAt(x, factor) {
    var t = view.start + (Math.max(x, GUTTER) - GUTTER) / scale();
    var span = Math.max((view.end - view.start) * factor, 0.001);
    view.start = t - (t - view.start) * (span / (view.end - view.start)); view.end = view.start + span;
  }

  function pan(dx, dy) {
    var dt = dx / scale();
    view.start -= dt; view.end -= dt; view.scrollY -= dy; clampScroll();
  }

  function trackLabelAt(x, y) {
    if (x >= GUTTER) { return null; }
    var cy = y - AXIS_H + view.scrollY;
    return layout.labels.filter(function (l) { return l.kind === 'track' && cy >= l.y && cy < l.y + l.h; })[0] || null;
  }

  function wire() {
    var drag = null;
    canvas.addEventListener('wheel', function (e) {
      e.preventDefault();
      if (e.shiftKey || Math.abs(e.deltaX) > Math.abs(e.deltaY)) { pan(-(e.deltaX || e.deltaY), 0); }
      else { zoomAt(e.offsetX, Math.pow(1.0015, e.deltaY)); }
      draw();
    }, { passive: false });
    canvas.addEventListener('mousedown', function (e) {
      drag = { x: e.clientX, y: e.clientY, moved: false }; canvas.classList.add('dragging');
    });
    window.addEventListener('mouseup', function (e) {
      if (drag && !drag.moved) { click(e); }
      drag = null; canvas.classList.remove('dragging');
    });
    window.addEventListener('mousemove', function (e) {
      if (!drag) { return; }
      var dx = e.clientX - drag.x, dy = e.clientY - drag.y;
      if (Math.abs(dx) + Math.abs(dy) > 2) { drag.moved = true; }
      drag.x = e.clientX; drag.y = e.clientY; card.hidden = true; pan(dx, dy); draw();
    });
    canvas.addEventListener('mousemove', function (e) {
      if (drag) { return; }
      var h = spanAt(e.offsetX, e.offsetY);
      var same = h && hover && h.run === hover.run && h.span === hover.span;
      hover = h;
      if (h) { showCard(h, e.offsetX, e.offsetY); } else { card.hidden = true; }
      if (!same) { draw(); }
    });
    canvas.addEventListener('mouseleave', function () { hover = null; card.hidden = true; draw(); });
    canvas.addEventListener('dblclick', function () { resetView(); draw(); });
    canvas.addEventListener('keydown', function (e) {
      var k = e.key.toLowerCase(), w = W - GUTTER;
      if (k === 'w') { zoomAt(GUTTER + w / 2, 0.8); } else if (k === 's') { zoomAt(GUTTER + w / 2, 1.25); }
      else if (k === 'a' || k === 'arrowleft') { pan(w * 0.15, 0); } else if (k === 'd' || k === 'arrowright') { pan(-w * 0.15, 0); }
      else if (k === 'arrowup') { pan(0, 60); } else if (k === 'arrowdown') { pan(0, -60); } else { return; }
      e.preventDefault(); draw();
    });
    document.getElementById('reset').addEventListener('click', function () { resetView(); draw(); });
    document.getElementById('widen').addEventListener('click', function () {
      document.getElementById('side').classList.toggle('wide'); resize();
    });
    document.getElementById('show-flows').addEventListener('change', function (e) { view.flows = e.target.checked; draw(); });
    document.getElementById('align').addEventListener('change', function (e) { view.align = e.target.value; resetView(); draw(); });
    window.addEventListener('resize', resize);
  }

  function click(e) {
    var box = canvas.getBoundingClientRect(), l = trackLabelAt(e.clientX - box.left, e.clientY - box.top);
    if (!l) { return; }
    var tr = l.run.tracks[l.track];
    if (tr.rows > 1) { tr.folded = !tr.folded; computeLayout(); clampScroll(); draw(); }
  }

  // ------------------------------------------------------------------ side panel
  function legend() {
    var seen = {}, ul = document.getElementById('legend');
    runs.forEach(function (run) {
      run.p.colours.forEach(function (c) {
        if (seen[c.key]) { return; }
        seen[c.key] = true;
        var li = document.createElement('li'), sw = document.createElement('span'), parts = c.key.split(':');
        sw.className = 'sw'; sw.style.background = c.colour; li.appendChild(sw);
        li.appendChild(document.createTextNode(parts[0] === 'kind' ? parts.slice(1).join(':') + ' (node kind)' :
          parts[0] === 'bound' ? 'step bounded by: ' + parts.slice(1).join(':') : parts.slice(1).join(':')));
        ul.appendChild(li);
      });
    });
  }

  function graphs() {
    var drawn = 0;
    document.querySelectorAll('section.graph[data-nodes]').forEach(function (sec) {
      var run = runs.filter(function (r) { return r.label === sec.dataset.run; })[0];
      var stats = JSON.parse(sec.dataset.nodes);
      sec.querySelectorAll('g.node').forEach(function (g) {
        var name = g.getAttribute('data-name'), st = stats[name], rect = g.querySelector('rect');
        if (!st || !rect) { return; }
        var text = document.createElementNS('http://www.w3.org/2000/svg', 'text');
        text.setAttribute('x', String(Number(rect.getAttribute('x')) + Number(rect.getAttribute('width')) / 2));
        text.setAttribute('y', String(Number(rect.getAttribute('y')) - 5));
        text.setAttribute('text-anchor', 'middle'); text.setAttribute('font-size', '15'); text.setAttribute('font-weight', 'bold');
        text.setAttribute('fill', '#b91c1c');
        text.setAttribute('class', 'node-time');
        text.textContent = st.fused_into ? 'fused into ' + st.fused_into :
          st.total_s.toFixed(2) + ' s \u00B7 ' + (100 * st.busy_share).toFixed(1) + '% busy';
        g.appendChild(text);
        keepInside(text, g.ownerSVGElement);
        drawn++;
        g.addEventListener('click', function () { pickNode(run, name, g); });
      });
    });
    document.body.dataset.graphNodes = String(drawn);
  }

  function keepInside(text, svg) {  // a caption wider than its box must not run off the drawing's edge
    var box = svg && svg.viewBox && svg.viewBox.baseVal, w = text.getComputedTextLength ? text.getComputedTextLength() : 0;
    if (!box || !box.width || !w) { return; }
    var x = Number(text.getAttribute('x')), lo = box.x + w / 2 + 2, hi = box.x + box.width - w / 2 - 2;
    text.setAttribute('x', String(Math.max(lo, Math.min(x, hi))));
  }

  function pickNode(run, name, g) {
    if (!run) { return; }
    var idx = run.p.names.indexOf(name);
    document.querySelectorAll('g.node.picked').forEach(function (x) { x.classList.remove('picked'); });
    if (picked && picked.run === run && picked.node === idx) { picked = null; }
    else { picked = { run: run, node: idx }; g.classList.add('picked'); }
    draw();
  }

  function notes() {
    var box = document.getElementById('notes'), count = 0;
    runs.forEach(function (run) {
      if (!run.p.notes || !run.p.notes.length) { return; }
      var div = document.createElement('div'), h = document.createElement('h4'), ul = document.createElement('ul');
      div.className = 'run-notes'; h.textContent = run.label + ': what is missing or was changed to draw it';
      run.p.notes.forEach(function (n) { var li = document.createElement('li'); li.textContent = n; ul.appendChild(li); count++; });
      div.appendChild(h); div.appendChild(ul); box.appendChild(div);
    });
    document.body.dataset.notes = String(count);
  }

  // Where a span is drawn, in canvas pixels (for scripted checks: tests drive the page through it).
  window.arealTimeline = {
    locate: function (runLabel, spanName) {
      var run = runs.filter(function (r) { return r.label === runLabel; })[0];
      if (!run) { return null; }
      var nameIdx = run.p.names.indexOf(spanName);
      for (var i = 0; i < run.n; i++) {
        if (run.name[i] === nameIdx) {
          var row = run.r[i], x0 = Math.max(xOf(run, run.t[i]), GUTTER), x1 = Math.min(xOf(run, run.t[i] + run.d[i]), W);
          return { x: (x0 + x1) / 2, y: yOf(run.rowY[row] + run.rowH[row] / 2), span: i };
        }
      }
      return null;
    }
  };

  // ------------------------------------------------------------------ start
  try {
    resetView();
    computeLayout();
    legend();
    notes();
    graphs();
    wire();
    resize();
    var b = document.body.dataset, tracks = 0, rows = 0, flows = 0, spans = 0;
    runs.forEach(function (r) { tracks += r.tracks.length; rows += r.rows; flows += r.flows.length; spans += r.n; });
    b.runs = String(runs.length); b.tracks = String(tracks); b.lanes = String(rows);
    b.flowsTotal = String(flows); b.spansTotal = String(spans);
    if (b.status !== 'error') { b.status = 'ok'; }
  } catch (err) {
    reportError('viewer: ' + (err && err.stack ? err.stack : err));
  }
}());
