// A live fragment is swapped whole every few seconds: what the reader did inside it survives the swap.
// Loaded on every page (base.html): any page may poll a fragment with a <details> in it.
// The <details> a reader opened (matched by id) are opened again in the new copy, so polling never
// folds them shut; one that loads its body when opened (hx-trigger "toggle") gets its loaded body back
// at once, and reloads it. A log box shows its latest lines (it opens at its end and stays
// there as lines arrive) unless the reader scrolled up in it, and then it stays where they left it.
(() => {
  let opened = [];
  let loaded = new Map(); // a lazy <details>'s id -> the body it had loaded
  let scrolledUp = new Map(); // a log's id -> where its reader left it
  const atEnd = (log) => log.scrollTop + log.clientHeight >= log.scrollHeight - 2;
  const logs = () => document.querySelectorAll("pre.log[id]");

  document.addEventListener("DOMContentLoaded", () => {
    for (const log of logs()) log.scrollTop = log.scrollHeight;
  });
  document.addEventListener("htmx:beforeSwap", (event) => {
    if (!event.detail.shouldSwap) return; // console.js held a poll off (text selected in it): nothing changes
    const target = event.detail.target;
    const open = [...target.querySelectorAll("details[id][open]")];
    opened = open.map((details) => details.id);
    loaded = new Map(
      open
        .filter((details) => /toggle/.test(details.getAttribute("hx-trigger") || ""))
        .map((details) => [details.id, [...details.childNodes].filter((node) => node.nodeName !== "SUMMARY")])
    );
    scrolledUp = new Map(
      [...target.querySelectorAll("pre.log[id]")].filter((log) => !atEnd(log)).map((log) => [log.id, log.scrollTop])
    );
  });
  // Reopened on swap, not settle: a <details> folded even for the settle's moment makes the page below it jump.
  let reload = [];
  document.addEventListener("htmx:afterSwap", () => {
    for (const id of opened) {
      const details = document.getElementById(id);
      if (!details) continue;
      if (loaded.has(id)) {
        for (const node of [...details.childNodes]) if (node.nodeName !== "SUMMARY") node.remove();
        details.append(...loaded.get(id));
        reload.push(details);
      }
      details.setAttribute("open", "");
    }
    opened = [];
    loaded = new Map();
    for (const log of logs()) log.scrollTop = scrolledUp.has(log.id) ? scrolledUp.get(log.id) : log.scrollHeight;
  });
  // htmx takes up the new copy's hx- attributes only as it settles, after that reopening's own "toggle":
  // the body it carried over is asked for afresh now.
  document.addEventListener("htmx:afterSettle", () => {
    for (const details of reload) if (details.isConnected) htmx.trigger(details, "toggle");
    reload = [];
  });
})();
