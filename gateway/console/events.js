// The live event stream (/v1/events, docs/design.md §8): authenticate with the first message,
// remember the cursor of every frame, and after a drop reconnect with ?cursor= so the server
// replays what was missed (no gap, no duplicate). Events carry ids only: listeners fetch what they
// name.

const CURSOR_KEY = "openbot.cursor";

export class EventStream {
  constructor(token, { onEvent, onReset, onStatus, onUnauthorized }) {
    this.token = token;
    this.onEvent = onEvent;
    this.onReset = onReset;
    this.onStatus = onStatus || (() => {});
    this.onUnauthorized = onUnauthorized || (() => {});
    this.cursor = sessionStorage.getItem(CURSOR_KEY);
    this.ws = null;
    this.closed = false;
    this.retry = 0;
    this.timer = null;
    this.seen = new Set(); // cursors already handled: a replay never delivers twice
    this.subscribed = false;
    // Resolves once the server has subscribed us: views read their data after that, so nothing
    // that happens between their read and the subscription can be missed.
    this.ready = new Promise((resolve) => (this.resolveReady = resolve));
  }

  start() {
    this.closed = false;
    this.connect();
  }

  stop() {
    this.closed = true;
    clearTimeout(this.timer);
    if (this.ws) this.ws.close(1000);
    this.ws = null;
  }

  // Test hook and manual "reconnect": drop the socket as a network failure would.
  drop() {
    if (this.ws) this.ws.close(4000, "dropped by the client");
  }

  connect() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const query = this.cursor ? `?cursor=${encodeURIComponent(this.cursor)}` : "";
    const ws = new WebSocket(`${scheme}://${location.host}/v1/events${query}`);
    ws.binaryType = "arraybuffer";
    this.ws = ws;
    this.onStatus("connecting");
    ws.onopen = () => ws.send(JSON.stringify({ type: "auth", token: this.token }));
    ws.onmessage = (msg) => {
      const text = typeof msg.data === "string" ? msg.data : new TextDecoder().decode(msg.data);
      let frame;
      try {
        frame = JSON.parse(text);
      } catch {
        return;
      }
      this.handle(frame);
    };
    ws.onclose = (ev) => {
      if (this.ws !== ws) return;
      this.ws = null;
      if (this.closed) return;
      if (ev.code === 4401) {
        this.onStatus("signed out");
        this.onUnauthorized();
        return;
      }
      if (ev.code === 4400) this.setCursor(null); // a cursor the server refuses: start afresh
      this.onStatus("reconnecting");
      const wait = Math.min(5000, 200 * 2 ** this.retry++);
      this.timer = setTimeout(() => this.connect(), wait);
    };
  }

  setCursor(cursor) {
    this.cursor = cursor;
    if (cursor) sessionStorage.setItem(CURSOR_KEY, cursor);
    else sessionStorage.removeItem(CURSOR_KEY);
  }

  handle(frame) {
    if (frame.type === "hello" || frame.type === "reset") {
      this.retry = 0;
      const gap = this.cursor === null; // reconnected without a cursor: events may be missed
      this.setCursor(frame.cursor);
      this.onStatus("live");
      if (!this.subscribed) {
        this.subscribed = true;
        this.resolveReady();
      } else if (frame.type === "reset" || gap) {
        // What is on screen may be behind: read it again, then continue from the new cursor.
        this.onReset(frame.type);
      }
      return;
    }
    if (frame.cursor) {
      if (this.seen.has(frame.cursor)) return;
      this.seen.add(frame.cursor);
      if (this.seen.size > 5000) this.seen = new Set([frame.cursor]);
      this.setCursor(frame.cursor);
    }
    this.onEvent(frame);
  }
}
