// Kumo portal: a VM's interactive serial console. xterm.js (vendored, static/portal/vendor)
// draws the terminal; each connection asks the portal for a fresh one-use token and opens
// the console proxy's websocket with it. Bytes go both ways as binary frames.
(function () {
  const el = document.getElementById("console-terminal");
  if (!el) return;
  const status = document.getElementById("console-status");
  const again = document.getElementById("console-reconnect");
  // The page's language: the template puts each status line, translated, in a data-text-*
  // attribute of the terminal's element; English is the fallback.
  const say = (key, english) => el.dataset[key] || english;
  const term = new Terminal({ cursorBlink: true, scrollback: 5000 });
  const fit = new FitAddon.FitAddon();
  term.loadAddon(fit);
  term.open(el);
  fit.fit();
  window.addEventListener("resize", () => fit.fit());
  const encoder = new TextEncoder();
  let socket = null;
  term.onData((data) => {
    if (socket && socket.readyState === WebSocket.OPEN) socket.send(encoder.encode(data));
  });

  async function connect() {
    again.hidden = true;
    status.textContent = say("textAsking", "Asking for a console token…");
    let answer, body = {};
    try {
      answer = await fetch(el.dataset.tokenUrl, {
        method: "POST",
        headers: { "X-CSRFToken": el.dataset.csrf, Accept: "application/json" },
        credentials: "same-origin",
      });
      body = await answer.json();
    } catch (e) {
      body.message = body.message || say("textNoAnswer", "The portal did not answer.");
    }
    if (!answer || !answer.ok) {
      status.textContent =
        body.message || say("textRefused", "Refused") + " (" + (answer && answer.status) + ").";
      again.hidden = false;
      return;
    }
    socket = new WebSocket(body.url);
    socket.binaryType = "arraybuffer";
    socket.onopen = () => {
      status.textContent = say(
        "textConnected",
        "Connected to the serial console. Press Enter if it stays quiet.",
      );
      term.focus();
    };
    socket.onmessage = (e) =>
      term.write(typeof e.data === "string" ? e.data : new Uint8Array(e.data));
    socket.onclose = (e) => {
      status.textContent =
        say("textDisconnected", "Disconnected") +
        (e.reason ? ": " + e.reason : "") +
        " (" +
        e.code +
        ").";
      socket = null;
      again.hidden = false;
    };
  }
  again.addEventListener("click", connect);
  connect();
})();
