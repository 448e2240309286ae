"""The lock console's HTML: the page listing held locks (refreshed by a small fetch of
``locks.json``), the confirmation page of a release, and the page saying what it did.

Every text from Redis or the user is escaped (``html.escape`` here, ``textContent`` in the
script). Links are relative, so the console works mounted under any path of another app.
"""

from __future__ import annotations

from html import escape

_STYLE = """
body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.3em;margin:0 0 .3em}
.meta{color:#666;margin-bottom:1em}
table{border-collapse:collapse;width:100%}
th,td{text-align:left;padding:.35em .6em;border-bottom:1px solid #ddd}
td{font-variant-numeric:tabular-nums}
th{background:#f4f4f4}
td.key{font-family:ui-monospace,monospace;font-size:12px;word-break:break-all}
.alive{color:#1a7f37}.gone{color:#c62828;font-weight:600}.unknown{color:#888}
.counters{margin-top:1.5em}
button{cursor:pointer}
.notice{padding:.8em;border:1px solid #ccc;background:#fafafa;max-width:50em}
"""

_SCRIPT = """
const meta = (n) => document.querySelector('meta[name="' + n + '"]').content;
const csrf = meta('csrf'), releases = meta('releases') === 'yes';
function cell(row, text, cls) {
  const td = document.createElement('td'); td.textContent = text;
  if (cls) td.className = cls; row.appendChild(td); return td;
}
function render(data) {
  const body = document.getElementById('locks'); body.replaceChildren();
  for (const lock of data.locks) {
    const tr = document.createElement('tr');
    cell(tr, lock.key, 'key'); cell(tr, lock.task_id || '-'); cell(tr, lock.host || '-');
    cell(tr, lock.pid === null ? '-' : String(lock.pid));
    const alive = lock.alive === null ? ['not asked', 'unknown']
      : lock.alive ? ['answers', 'alive'] : ['does not answer', 'gone'];
    cell(tr, alive[0], alive[1]);
    cell(tr, lock.ttl === null ? 'none' : lock.ttl.toFixed(1) + 's');
    cell(tr, lock.fence === null ? '-' : String(lock.fence));
    cell(tr, String(lock.parked));
    if (releases && lock.alive === true) {
      cell(tr, 'running', 'alive');  // a holder whose node answers is not released
    } else if (releases) {
      const td = cell(tr, ''); const form = document.createElement('form');
      form.method = 'post'; form.action = 'release/confirm';
      for (const [k, v] of [['name', lock.key], ['csrf', csrf]]) {
        const input = document.createElement('input');
        input.type = 'hidden'; input.name = k; input.value = v; form.appendChild(input);
      }
      const button = document.createElement('button'); button.textContent = 'Release…';
      form.appendChild(button); td.appendChild(form);
    }
    body.appendChild(tr);
  }
  document.getElementById('summary').textContent =
    data.locks.length + ' lock(s) held under prefix ' + data.prefix + ' on ' + data.server
    + (data.truncated ? ' (first ' + data.locks.length + ' shown)' : '')
    + ' · refreshed ' + new Date().toLocaleTimeString();
  const rules = document.getElementById('rules'); rules.replaceChildren();
  for (const rule of data.rules || []) {  // live caps and pauses (celery locks limit / pause)
    const tr = document.createElement('tr');
    cell(tr, rule.family, 'key');
    cell(tr, rule.live_cap === null ? 'declared' : String(rule.live_cap));
    cell(tr, !rule.paused ? 'no' : rule.paused_until === null ? 'until resumed'
      : 'until ' + new Date(rule.paused_until * 1000).toLocaleTimeString()
        + ' (' + rule.paused_for.toFixed(1) + 's more)', rule.paused ? 'gone' : '');
    rules.appendChild(tr);
  }
  document.getElementById('rules-box').hidden = !(data.rules || []).length;
  const counters = document.getElementById('counters'); counters.replaceChildren();
  for (const [task, c] of Object.entries(data.counters || {})) {
    const tr = document.createElement('tr');
    cell(tr, task, 'key'); cell(tr, String(c.acquired)); cell(tr, String(c.duplicates));
    cell(tr, String(c.lost)); counters.appendChild(tr);
  }
  document.getElementById('counters-box').hidden = data.counters === null;
}
async function refresh() {
  try {
    const response = await fetch('locks.json', {cache: 'no-store'});
    render(await response.json());
  } catch (e) {
    document.getElementById('summary').textContent = 'cannot refresh: ' + e;
  }
}
refresh(); setInterval(refresh, 2000);
"""


def _document(title: str, body: str, head: str = "") -> str:
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<title>{escape(title)}</title>{head}<style>{_STYLE}</style></head>"
        f"<body>{body}</body></html>"
    )


def lock_list_page(csrf: str, releases: bool) -> str:
    """The page of held locks; its rows come from ``locks.json``."""
    head = (
        f'<meta name="csrf" content="{escape(csrf)}">'
        f'<meta name="releases" content="{"yes" if releases else "no"}">'
    )
    mode = "releases allowed (each asks for a confirmation)" if releases else "read-only"
    release_column = "<th></th>" if releases else ""
    body = (
        "<h1>Singleton locks</h1>"
        f'<div class="meta"><span id="summary">loading…</span> · {mode}</div>'
        "<table><thead><tr><th>lock</th><th>task</th><th>holder node</th><th>pid</th>"
        "<th>node</th><th>TTL left</th><th>fence</th><th>parked</th>"
        f'{release_column}</tr></thead><tbody id="locks"></tbody></table>'
        '<div class="counters" id="rules-box" hidden><h2>Live caps and pauses</h2>'
        "<table><thead><tr><th>task or group</th><th>live cap</th><th>paused</th>"
        '</tr></thead><tbody id="rules"></tbody></table></div>'
        '<div class="counters" id="counters-box" hidden><h2>Since the workers started</h2>'
        "<table><thead><tr><th>task</th><th>acquired</th><th>duplicates</th><th>lost</th>"
        '</tr></thead><tbody id="counters"></tbody></table></div>'
        f"<script>{_SCRIPT}</script>"
    )
    return _document("Singleton locks", body, head)


def confirm_page(csrf: str, name: str, holder: str, alive: str, task_id: str) -> str:
    """The confirmation step: what would be released, and a second POST to do it."""
    body = (
        "<h1>Release this lock?</h1>"
        f'<div class="notice"><p>Lock <code>{escape(name)}</code></p>'
        f"<p>Held by {escape(holder)}; its node {escape(alive)}.</p>"
        "<p>It is released only if it still names this holder, and only if the holder's "
        "node does not answer a ping.</p>"
        '<form method="post" action="../release">'
        f'<input type="hidden" name="name" value="{escape(name)}">'
        f'<input type="hidden" name="task_id" value="{escape(task_id)}">'
        f'<input type="hidden" name="csrf" value="{escape(csrf)}">'
        '<input type="hidden" name="confirm" value="yes">'
        '<button type="submit">Release it</button> <a href="../">Cancel</a></form></div>'
    )
    return _document("Release this lock?", body)


def outcome_page(title: str, message: str, back: str = "./") -> str:
    body = (
        f"<h1>{escape(title)}</h1><div class=notice><p>{escape(message)}</p>"
        f'<p><a href="{escape(back)}">Back to the locks</a></p></div>'
    )
    return _document(title, body)
