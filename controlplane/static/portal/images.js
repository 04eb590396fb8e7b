// Kumo portal: image upload. The record is made with a JSON POST, then the file is sent as
// the raw body of one PUT (the browser streams a File body; nothing is read into memory
// here), both through the API with the session and the CSRF token.
document.addEventListener("submit", async (e) => {
  const form = e.target;
  if (form.id !== "image-upload") return;
  e.preventDefault();
  const status = document.getElementById("image-upload-status");
  const csrf = form.querySelector("[name=csrfmiddlewaretoken]").value;
  const headers = { "X-CSRFToken": csrf };
  const data = new FormData(form);
  const file = data.get("file");
  const record = {};
  for (const key of ["name", "os_distro", "os_version", "format", "login_user"]) {
    record[key] = data.get(key) || "";
  }
  const fail = async (response) => {
    const body = await response.json().catch(() => ({}));
    status.textContent = "Refused: " + (body.message || response.status);
  };
  status.textContent = "Creating…";
  let response = await fetch(form.dataset.api, {
    method: "POST",
    headers: { ...headers, "Content-Type": "application/json" },
    body: JSON.stringify(record),
    credentials: "same-origin",
  });
  if (!response.ok) return fail(response);
  const image = await response.json();
  status.textContent = "Uploading " + file.size + " bytes…";
  response = await fetch(form.dataset.api + image.id + "/file/", {
    method: "PUT",
    headers: { ...headers, "Content-Type": "application/octet-stream" },
    body: file,
    credentials: "same-origin",
  });
  if (!response.ok) return fail(response);
  window.location.reload();
});
