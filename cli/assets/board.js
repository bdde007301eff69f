// The web board's script: embedded in the binary, served as /assets/board.js.
// Every page works without it (forms); with it, the page goes live, cards
// move by dragging or by keys, and bulk actions answer in place.
(function () {
  'use strict';
  var toast = document.getElementById('toast');
  // Where this board's pages and API are: '' or /boards/SLUG.
  var base = document.body.getAttribute('data-base') || '';
  var state = document.getElementById('live');
  var targets = Array.from(document.querySelectorAll('[data-fragment]'));
  var selected = new Set();
  var dragging = null;
  var busy = false, again = false, waiting = false;
  document.addEventListener('focusout', function (e) {
    // Going from one field of a form to the next is still typing in it.
    var form = e.target.closest && e.target.closest('form');
    if (form && e.relatedTarget && form.contains(e.relatedTarget)) return;
    if (waiting) { waiting = false; setTimeout(refresh, 0); }
  });

  // A part being typed in: a field in it has the focus, or holds what was
  // typed and not yet sent. Fetching it again would throw that away.
  function typingIn(target) {
    var active = document.activeElement;
    if (active && target.contains(active) && active.matches('input:not(.pick), textarea, select')) return true;
    return Array.from(target.querySelectorAll('input:not(.pick):not([type=hidden]), textarea, select')).some(function (field) {
      if (field.matches('select')) {
        return Array.from(field.options).some(function (o) { return o.selected !== o.defaultSelected; });
      }
      if (field.type === 'checkbox' || field.type === 'radio') return field.checked !== field.defaultChecked;
      return field.value !== field.defaultValue;
    });
  }

  function say(text, bad) {
    toast.textContent = text;
    toast.className = bad ? 'shown bad' : 'shown';
    clearTimeout(say.timer);
    say.timer = setTimeout(function () { toast.className = ''; }, 8000);
  }

  function tileOf(id) {
    return document.querySelector('.card[data-card="' + CSS.escape(id) + '"]');
  }

  function focusedTile() {
    var active = document.activeElement;
    return active && active.closest ? active.closest('.card[data-card]') : null;
  }

  // After the lanes are fetched again: the same cards checked, the same
  // card focused. A selected card no longer shown (moved on, filtered
  // out) leaves the selection: a bulk action acts only on what is seen.
  function restore(focused) {
    var shown = new Set();
    document.querySelectorAll('input.pick').forEach(function (box) {
      shown.add(box.value);
      box.checked = selected.has(box.value);
      box.closest('.card').classList.toggle('selected', box.checked);
    });
    selected.forEach(function (id) { if (!shown.has(id)) selected.delete(id); });
    showSelected();
    var tile = focused && tileOf(focused);
    if (tile) tile.querySelector('a.title').focus();
  }

  function refresh() {
    if (!targets.length) return Promise.resolve();
    if (busy || dragging) { again = true; return Promise.resolve(); }
    busy = true;
    var focused = focusedTile();
    focused = focused && focused.getAttribute('data-card');
    return Promise.all(targets.map(function (target) {
      // A part being typed in waits until its field is left, and keeps
      // what was typed until it is sent.
      if (typingIn(target)) {
        waiting = true;
        return null;
      }
      return fetch(target.getAttribute('data-fragment'), {credentials: 'same-origin'})
        .then(function (r) { return r.ok ? r.text() : null; })
        .then(function (html) { if (html !== null) target.innerHTML = html; });
    }))
      .then(function () { restore(focused); followLog(); }, function () {})
      .finally(function () { busy = false; if (again) { again = false; refresh(); } });
  }

  if (targets.length && window.EventSource) {
    var source = new EventSource(base + '/live');
    source.addEventListener('changed', refresh);
    source.onopen = function () { state.textContent = '● live'; };
    source.onerror = function () { state.textContent = '○ reconnecting'; };
  }

  // A card's log, as it grows: appended to its tail (which keeps its last
  // 200 lines) from the byte the tail ends on, while the card runs. The
  // stream ends when the run does; a refresh that shows the card running
  // again follows the next run.
  var logSource = null;
  function followLog() {
    var pre = document.querySelector('pre[data-log]');
    var status = document.querySelector('[data-fragment$="?part=head"] [data-status]');
    if (!pre || logSource || !window.EventSource) return;
    if (!status || status.getAttribute('data-status') !== 'running') return;
    logSource = new EventSource(pre.getAttribute('data-log') + '?from=' +
                                encodeURIComponent(pre.getAttribute('data-from') || '0'));
    logSource.addEventListener('log', function (e) {
      var text = pre.textContent;
      var lines = (text + (text && !text.endsWith('\n') ? '\n' : '') + e.data).split('\n');
      pre.textContent = lines.slice(-201).join('\n');
      pre.setAttribute('data-from', e.lastEventId);
      var none = document.querySelector('[data-no-log]');
      if (none) none.remove();
      pre.scrollTop = pre.scrollHeight;
    });
    var stop = function () { logSource.close(); logSource = null; };
    logSource.addEventListener('end', stop);
    // Refused (too many followed): the next refresh tries again.
    logSource.addEventListener('error', function () {
      if (logSource && logSource.readyState === EventSource.CLOSED) stop();
    });
  }
  followLog();

  function post(path, body) {
    return fetch(path, {
      method: 'POST',
      credentials: 'same-origin',
      headers: {'Content-Type': 'application/json'},
      body: JSON.stringify(body)
    }).then(function (r) {
      return r.json().catch(function () { return {}; }).then(function (answer) {
        return {ok: r.ok, answer: answer};
      });
    }, function () {
      return {ok: false, answer: {error: 'the board did not answer: is kanban serve still running?'}};
    });
  }

  // Moves a card to a lane: only the moves the board allows, and only from
  // the lane the page shows it in; a refused one goes back where it was
  // and says why.
  function move(id, from, to, undo) {
    return post(base + '/api/cards/' + encodeURIComponent(id) + '/move',
                {to: to, from: from, reason: 'moved on the web board'})
      .then(function (result) {
        if (result.ok) say(id + ' moved to ' + to);
        else { if (undo) undo(); say(result.answer.error || 'the move was refused', true); }
        return refresh();
      });
  }

  function act(id, action) {
    return post(base + '/api/cards/' + encodeURIComponent(id) + '/' + action, {})
      .then(function (result) {
        say(result.ok ? id + ': ' + action + ' done' : (result.answer.error || action + ' refused'), !result.ok);
        return refresh();
      });
  }

  // Dragging: pointer events, so a mouse, a pen and WebDriver all drive it.
  document.addEventListener('dragstart', function (e) {
    if (e.target.closest && e.target.closest('.card[data-card]')) e.preventDefault();
  });
  document.addEventListener('pointerdown', function (e) {
    var tile = e.target.closest && e.target.closest('.card[data-card]');
    if (!tile || e.button !== 0 || e.target.matches('input')) return;
    dragging = {tile: tile, x: e.clientX, y: e.clientY, moving: false,
                lane: tile.closest('[data-lane]'), next: tile.nextSibling};
  });
  function laneAt(x, y) {
    var under = document.elementFromPoint(x, y);
    return under && under.closest ? under.closest('[data-lane]') : null;
  }
  function mark(lane) {
    document.querySelectorAll('.lane.drop').forEach(function (l) { if (l !== lane) l.classList.remove('drop'); });
    if (lane) lane.classList.add('drop');
  }
  document.addEventListener('pointermove', function (e) {
    if (!dragging) return;
    var dx = e.clientX - dragging.x, dy = e.clientY - dragging.y;
    if (!dragging.moving && Math.abs(dx) + Math.abs(dy) < 6) return;
    dragging.moving = true;
    dragging.tile.classList.add('dragging');
    dragging.tile.style.transform = 'translate(' + dx + 'px,' + dy + 'px)';
    mark(laneAt(e.clientX, e.clientY));
    e.preventDefault();
  });
  function drop(e) {
    var drag = dragging;
    dragging = null;
    if (again) { again = false; refresh(); }
    if (!drag || !drag.moving) return;
    // A live update replaced the lanes meanwhile: the card dragged is gone.
    if (!drag.tile.isConnected) { mark(null); return; }
    drag.tile.classList.remove('dragging');
    drag.tile.style.transform = '';
    mark(null);
    // The click that ends a drag (if the browser sends one) opens nothing.
    var swallow = function (c) { c.preventDefault(); c.stopPropagation(); };
    window.addEventListener('click', swallow, {capture: true, once: true});
    setTimeout(function () { window.removeEventListener('click', swallow, {capture: true}); }, 0);
    var lane = e.type === 'pointerup' ? laneAt(e.clientX, e.clientY) : null;
    if (!lane || lane.getAttribute('data-lane') === drag.lane.getAttribute('data-lane')) return;
    var heading = lane.querySelector('h2');
    lane.insertBefore(drag.tile, heading ? heading.nextSibling : lane.firstChild);
    move(drag.tile.getAttribute('data-card'), drag.tile.getAttribute('data-status'),
         lane.getAttribute('data-lane'), function () {
      drag.lane.insertBefore(drag.tile, drag.next && drag.next.parentNode === drag.lane ? drag.next : null);
    });
  }
  document.addEventListener('pointerup', drop);
  document.addEventListener('pointercancel', drop);

  // Selection for bulk actions.
  function showSelected() {
    var label = document.getElementById('selected');
    if (label) label.textContent = selected.size + ' selected:';
  }
  document.addEventListener('change', function (e) {
    if (!e.target.matches('input.pick')) return;
    if (e.target.checked) selected.add(e.target.value); else selected.delete(e.target.value);
    e.target.closest('.card').classList.toggle('selected', e.target.checked);
    showSelected();
  });
  var bulk = document.getElementById('bulk');
  if (bulk) bulk.addEventListener('submit', function (e) {
    e.preventDefault();
    var form = new FormData(bulk);
    var action = form.get('action');
    post(base + '/api/bulk', {cards: Array.from(selected), action: action, text: form.get('text') || '',
                       reason: form.get('reason') || '', to: form.get('to') || ''})
      .then(function (result) {
        if (!result.ok) { say(result.answer.error || 'refused', true); return; }
        var refused = result.answer.results.filter(function (r) { return !r.ok; });
        var done = result.answer.results.length - refused.length;
        say(action + ': ' + done + ' done' + (refused.length ? '; refused: ' +
            refused.map(function (r) { return r.error; }).join('; ') : ''), refused.length > 0);
        result.answer.results.forEach(function (r) { if (r.ok) selected.delete(r.id); });
        return refresh();
      });
  });

  // An upload: the chosen file is the request's body, as the API takes it.
  document.querySelectorAll('form[data-upload]').forEach(function (form) {
    form.addEventListener('submit', function (e) {
      e.preventDefault();
      var file = form.querySelector('input[type=file]').files[0];
      if (!file) return;
      // Said before 25 MiB go over the wire only to be refused.
      if (file.size > 25 * 1024 * 1024) { say(file.name + ' is over 25 MiB: a card takes files of at most 25 MiB', true); return; }
      var url = form.getAttribute('data-upload') + '?name=' + encodeURIComponent(file.name) +
                (file.type ? '&type=' + encodeURIComponent(file.type) : '');
      fetch(url, {method: 'POST', credentials: 'same-origin',
                  headers: {'Content-Type': 'application/octet-stream'}, body: file})
        .then(function (r) {
          return r.json().catch(function () { return {}; }).then(function (answer) {
            say(r.ok ? file.name + ' attached' : (answer.error || 'the upload was refused'), !r.ok);
            if (r.ok) form.reset();
            return refresh();
          });
        }, function () { say('the board did not answer: is kanban serve still running?', true); });
    });
  });

  // Keys: focus a card, then a key per action; `?` lists them.
  var keys = document.getElementById('keys');
  function help() { if (keys && !keys.open) keys.showModal(); }
  document.querySelectorAll('[data-keys-help]').forEach(function (b) { b.addEventListener('click', help); });
  function step(tile, by) {
    var tiles = Array.from(tile.closest('[data-lane]').querySelectorAll('.card[data-card]'));
    return tiles[tiles.indexOf(tile) + by];
  }
  function sideways(tile, by) {
    var lanes = Array.from(document.querySelectorAll('[data-lane]'));
    var lane = tile.closest('[data-lane]');
    var at = Array.from(lane.querySelectorAll('.card[data-card]')).indexOf(tile);
    for (var i = lanes.indexOf(lane) + by; i >= 0 && i < lanes.length; i += by) {
      var cards = lanes[i].querySelectorAll('.card[data-card]');
      if (cards.length) return cards[Math.min(at, cards.length - 1)];
    }
    return null;
  }
  var MOVES = {r: 'ready', t: 'triage', v: 'review', s: 'scheduled'};
  var ACTS = {u: 'release', a: 'archive'};
  document.addEventListener('keydown', function (e) {
    if (e.ctrlKey || e.metaKey || e.altKey) return;
    // Typing in a field is typing, not a command.
    if (e.target.matches && e.target.matches('input:not(.pick), textarea, select, dialog *')) return;
    if (e.key === '?') { e.preventDefault(); help(); return; }
    if (e.key === '/') {
      var search = document.getElementById('search');
      if (search) { e.preventDefault(); search.focus(); }
      return;
    }
    var tile = focusedTile();
    var go = null;
    if (!tile) {
      if (e.key === 'j' || e.key === 'k') go = document.querySelector('.card[data-card]');
    } else if (e.key === 'j') go = step(tile, 1);
    else if (e.key === 'k') go = step(tile, -1);
    else if (e.key === 'l') go = sideways(tile, 1);
    else if (e.key === 'h') go = sideways(tile, -1);
    else if (e.key === 'x') {
      var box = tile.querySelector('input.pick');
      box.checked = !box.checked;
      box.dispatchEvent(new Event('change', {bubbles: true}));
    } else if (MOVES[e.key]) {
      var status = tile.getAttribute('data-status');
      // Taking a run back stops its agent: asked first.
      if (status === 'running' && e.key === 'r' && !confirm('Terminate the run of ' + tile.getAttribute('data-card') + '?')) return;
      move(tile.getAttribute('data-card'), status, MOVES[e.key]);
    } else if (ACTS[e.key]) {
      if (e.key === 'a' && !confirm('Archive ' + tile.getAttribute('data-card') + '?')) return;
      act(tile.getAttribute('data-card'), ACTS[e.key]);
    } else return;
    e.preventDefault();
    if (go) go.querySelector('a.title').focus();
  });
})();
