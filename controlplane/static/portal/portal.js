// Kumo portal: the project switcher, spot-notice countdowns, copy buttons, an upload's
// progress and a question before what cannot be undone. Everything else is htmx.
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

// An upload form (data-upload-progress, an image's) is sent by htmx, which reports the bytes
// sent: its <progress> follows them, then says the server is storing the file (it hashes
// every byte before it answers). The answer replaces the page: the list with the new image
// and its message, or the form with its errors (a 400, which htmx would otherwise not
// show). Without JavaScript the form posts as any other.
function uploadLine(form, text, percent) {
  const line = form.querySelector("[data-progress]");
  line.hidden = false;
  if (percent !== undefined) line.querySelector("progress").value = percent;
  line.querySelector("[role=status]").textContent = text(form.dataset);
}
const uploading = (e) => {
  const sender = e.detail.requestConfig && e.detail.requestConfig.elt;
  return sender && sender.matches("form[data-upload-progress]") ? sender : null;
};
document.addEventListener("htmx:beforeSend", (e) => {
  const form = uploading(e);
  if (!form) return;
  for (const errors of form.querySelectorAll(".errorlist")) errors.hidden = true; // the last answer's
  e.detail.xhr.upload.addEventListener("progress", (sent) => {
    if (!sent.lengthComputable) return;
    const percent = Math.round((100 * sent.loaded) / sent.total);
    uploadLine(form, (say) => (percent < 100 ? `${percent} % ${say.sent}` : say.storing), percent);
  });
});
document.addEventListener("htmx:beforeSwap", (e) => {
  if (e.detail.xhr.status === 400 && uploading(e)) {
    e.detail.shouldSwap = true;
    e.detail.isError = false;
  }
});
document.addEventListener("htmx:responseError", (e) => {
  const form = uploading(e);
  const { status, statusText } = e.detail.xhr;
  if (form) uploadLine(form, (say) => `${say.failed} ${status} ${statusText}`);
});
document.addEventListener("htmx:sendError", (e) => {
  const form = uploading(e);
  if (form) uploadLine(form, (say) => say.failed);
});

// A form that destroys what cannot be had back (data-confirm: a VM's delete, a volume's,
// a share's, a bucket's; a power-off) asks first. Caught before htmx's own handler sees the
// submit; without JavaScript the form posts as it always did.
document.addEventListener(
  "submit",
  (e) => {
    const question = e.target.dataset && e.target.dataset.confirm;
    if (question && !window.confirm(question)) {
      e.preventDefault();
      e.stopImmediatePropagation();
    }
  },
  true,
);
