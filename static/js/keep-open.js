// A live fragment is swapped whole every few seconds: what the reader did inside it survives the swap.
// The <details> a reader opened (matched by id) are opened again in the new copy, so polling never
// folds them shut; a log box shows its latest lines (it opens at its end and stays there as lines
// arrive) unless the reader scrolled up in it, and then it stays where they left it.
(() => {
  let opened = [];
  let scrolledUp = new Map(); // a log's id -> where its reader left it
  const atEnd = (log) => log.scrollTop + log.clientHeight >= log.scrollHeight - 2;
  const logs = () => document.querySelectorAll("pre.log[id]");

  document.addEventListener("DOMContentLoaded", () => {
    for (const log of logs()) log.scrollTop = log.scrollHeight;
  });
  document.addEventListener("htmx:beforeSwap", (event) => {
    const target = event.detail.target;
    opened = [...target.querySelectorAll("details[id][open]")].map((details) => details.id);
    scrolledUp = new Map(
      [...target.querySelectorAll("pre.log[id]")].filter((log) => !atEnd(log)).map((log) => [log.id, log.scrollTop])
    );
  });
  document.addEventListener("htmx:afterSettle", () => {
    for (const id of opened) document.getElementById(id)?.setAttribute("open", "");
    for (const log of logs()) log.scrollTop = scrolledUp.has(log.id) ? scrolledUp.get(log.id) : log.scrollHeight;
  });
})();
