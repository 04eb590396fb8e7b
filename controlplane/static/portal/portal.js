// Kumo portal: the project switcher, spot-notice countdowns and copy buttons. Everything
// else is htmx.
document.addEventListener("change", (e) => {
  if (e.target.matches("select[data-autosubmit]")) e.target.form.submit();
});
function tick() {
  for (const el of document.querySelectorAll("[data-deadline]")) {
    const left = Math.max(0, Math.round((Date.parse(el.dataset.deadline) - Date.now()) / 1000));
    el.textContent = left > 0 ? left + " s" : el.dataset.now || "now"; // data-now: translated
  }
}
setInterval(tick, 1000);
document.addEventListener("DOMContentLoaded", tick);
document.addEventListener("htmx:afterSwap", tick);
// A button with data-copy="<selector>" copies that element's text (e.g. a VM's ssh command).
document.addEventListener("click", (e) => {
  const button = e.target.closest("[data-copy]");
  if (!button) return;
  const source = document.querySelector(button.dataset.copy);
  if (!source || !navigator.clipboard) return;
  navigator.clipboard.writeText(source.textContent.trim()).then(() => {
    button.textContent = button.dataset.copied || "Copied"; // data-copied: translated
  });
});

// Times in the reader's time zone: the browser's IANA zone in a cookie the server reads
// (controlplane.portal.locale.PortalTimezoneMiddleware); the next page uses it.
(() => {
  let zone = "";
  try { zone = Intl.DateTimeFormat().resolvedOptions().timeZone || ""; } catch (e) { return; }
  const value = encodeURIComponent(zone);
  if (zone && !document.cookie.split("; ").includes("kumo_tz=" + value)) {
    document.cookie = "kumo_tz=" + value + "; path=/; max-age=31536000; samesite=lax";
  }
})();
