// A live fragment is swapped whole every few seconds: the <details> a reader opened inside it
// (matched by id) are opened again in the new copy, so polling never folds them shut.
(() => {
  let opened = [];
  document.addEventListener("htmx:beforeSwap", (event) => {
    opened = [...event.detail.target.querySelectorAll("details[id][open]")].map((details) => details.id);
  });
  document.addEventListener("htmx:afterSettle", () => {
    for (const id of opened) document.getElementById(id)?.setAttribute("open", "");
  });
})();
