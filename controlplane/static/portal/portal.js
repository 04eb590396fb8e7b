// Kumo portal: the project switcher and spot-notice countdowns. Everything else is htmx.
document.addEventListener("change", (e) => {
  if (e.target.matches("select[data-autosubmit]")) e.target.form.submit();
});
function tick() {
  for (const el of document.querySelectorAll("[data-deadline]")) {
    const left = Math.max(0, Math.round((Date.parse(el.dataset.deadline) - Date.now()) / 1000));
    el.textContent = left > 0 ? left + " s" : "now";
  }
}
setInterval(tick, 1000);
document.addEventListener("DOMContentLoaded", tick);
document.addEventListener("htmx:afterSwap", tick);
