// A chat: its items live from chat.item.created (each event names one item, which is fetched
// once; items are kept by id, so a replayed or doubled event never shows twice), the composer
// (@mentions, rounds), the collaboration chains of the chat, and its confessions, enrichments
// and memory jobs, and its requests (requests.js).

import { api, get, post } from "./api.js";
import { avatar, clear, h, pick, time } from "./dom.js";
import { jobCard, offers } from "./memory.js";
import { loadProjects } from "./projects.js";
import { loadRequests, openRequest } from "./requests.js";
import { avatarOf, nameOf, state } from "./state.js";

const WS = "/api/app/workspace";

function seq(id) {
  const n = Number(String(id).replace(/^i-/, ""));
  return Number.isFinite(n) ? n : 0;
}

export class ChatView {
  constructor(layout, main, chatId) {
    this.layout = layout;
    this.main = main;
    this.chatId = chatId;
    this.items = new Map(); // item id -> element
    this.pending = new Set(); // item ids being fetched
    this.mentions = new Set();
    this.side = h("aside", { class: "side", id: "side" });
  }

  get chat() {
    return state.chats.get(this.chatId);
  }

  close() {
    this.side.remove();
  }

  async show() {
    const chat = this.chat;
    const title = chat?.title || this.chatId;
    this.list = h("div", { class: "items", testid: "item-list" });
    this.input = h("textarea", {
      testid: "message-input",
      placeholder: chat?.kind === "group" ? "Message the group (@Name to pick bots)" : "Message",
      rows: 2,
      onkeydown: (ev) => {
        if (ev.key === "Enter" && !ev.shiftKey) {
          ev.preventDefault();
          this.send();
        }
      },
    });
    this.rounds = h(
      "select",
      { testid: "rounds", title: "Rounds (a discussion defaults to 2)" },
      h("option", { value: "" }, "rounds: auto"),
      Array.from({ length: 12 }, (_, k) => h("option", { value: String(k + 1) }, `${k + 1} round${k ? "s" : ""}`)),
    );
    this.sendButton = h("button", { class: "primary", testid: "send", onclick: () => this.send() }, "Send");
    this.error = h("div", { class: "error", role: "alert", testid: "send-error" });
    const bots = chat?.bots || [];
    clear(
      this.main,
      h(
        "div",
        { class: "chat", testid: "chat-view", data: { chatId: this.chatId } },
        h(
          "div",
          { class: "chat-head" },
          h("h1", {}, title),
          h("span", { class: "badge" }, chat?.kind ?? "chat"),
          chat?.kind === "group"
            ? h(
                "div",
                { class: "mentions", testid: "mentions" },
                bots.map((b) =>
                  h(
                    "button",
                    {
                      class: "mention",
                      testid: "mention",
                      data: { botId: b.id },
                      title: `Only ${b.name} answers (click again for everyone)`,
                      onclick: (ev) => this.toggleMention(b, ev.currentTarget),
                    },
                    avatar(b.name, b.avatar, 16),
                    ` @${b.name}`,
                  ),
                ),
              )
            : null,
          this.projectPicker(chat),
        ),
        this.list,
        h("div", { class: "composer" }, h("div", {}, this.input, this.error), this.rounds, this.sendButton),
      ),
    );
    this.chainList = h("ul", { testid: "chain-list" });
    this.records = h("div", { testid: "chat-records" });
    this.requestList = h("ul", { testid: "request-list" });
    const asks = chat?.kind === "direct" || chat?.kind === "group";
    clear(
      this.side,
      h("h2", {}, "Requests"),
      asks
        ? h(
            "button",
            { testid: "request-open", title: "Ask for approval of what the message box says", onclick: () => this.ask() },
            "Ask for approval",
          )
        : null,
      this.requestList,
      h("h2", {}, "Collaboration"),
      this.chainList,
      h("h2", {}, "Confessions, enrichments, memory jobs"),
      h("button", { onclick: () => this.loadRecords(), testid: "load-records" }, "Show"),
      this.records,
    );
    this.layout.append(this.side);
    await Promise.all([this.loadItems(), this.loadChains(), this.loadRequests()]);
  }

  async refresh() {
    await Promise.all([this.loadItems(), this.loadChains(), this.loadRequests()]);
  }

  loadRequests() {
    return loadRequests(this.requestList, this.chatId);
  }

  // The composer's text as a request of the person's own (a group's picked bot wakes).
  async ask() {
    const text = this.input.value.trim();
    if (!text) return;
    this.error.textContent = "";
    try {
      await openRequest(this.chatId, text, [...this.mentions][0]);
      this.input.value = "";
      await this.loadRequests();
    } catch (e) {
      this.error.textContent = e.message;
    }
  }

  // WS-7: a direct chat's current project, chosen among the person's projects (set, changed
  // or cleared here; chat.updated keeps every open console in step).
  projectPicker(chat) {
    if (!chat || !["direct", "review"].includes(chat.kind) || !offers("bot-projects-v1")) return null;
    this.project = h("select", {
      testid: "chat-project",
      title: "The chat's current project: its memory goes into the bot's prompt",
      onchange: () => this.setProject(this.project.value || null),
    });
    this.projectError = h("span", { class: "error small", testid: "chat-project-error" });
    loadProjects()
      .then((projects) => {
        clear(
          this.project,
          h("option", { value: "" }, "no project"),
          projects.map((p) => h("option", { value: p.id }, p.name)),
        );
        this.project.value = this.chat?.project ?? "";
      })
      .catch((e) => (this.projectError.textContent = e.message));
    return h("label", { class: "small" }, "project ", this.project, this.projectError);
  }

  async setProject(project) {
    this.projectError.textContent = "";
    try {
      const chat = await api("PATCH", `/v1/chats/${encodeURIComponent(this.chatId)}`, { project });
      const held = state.chats.get(this.chatId);
      if (held && (held.revision ?? 1) < chat.revision)
        state.chats.set(this.chatId, { ...held, project: chat.project, revision: chat.revision });
    } catch (e) {
      this.projectError.textContent = e.message;
    }
    this.project.value = this.chat?.project ?? "";
  }

  toggleMention(bot, button) {
    if (this.mentions.has(bot.id)) this.mentions.delete(bot.id);
    else this.mentions.add(bot.id);
    button.classList.toggle("on", this.mentions.has(bot.id));
  }

  async send() {
    const text = this.input.value.trim();
    if (!text) return;
    const body = { text };
    if (this.rounds.value) body.rounds = Number(this.rounds.value);
    const named = [...this.mentions];
    // @Name in the text picks bots as well (the server reads it too); explicit ids are exact.
    for (const b of this.chat?.bots || []) {
      if (text.toLowerCase().includes(`@${b.name.toLowerCase()}`) && !named.includes(b.id)) named.push(b.id);
    }
    if (named.length && this.chat?.kind === "group") body.mentions = named;
    this.sendButton.disabled = true;
    this.error.textContent = "";
    try {
      await post(`/v1/chats/${encodeURIComponent(this.chatId)}/turns`, body);
      this.input.value = "";
    } catch (e) {
      this.error.textContent = e.message;
    } finally {
      this.sendButton.disabled = false;
      this.input.focus();
    }
  }

  async loadItems() {
    const data = await get(`/v1/chats/${encodeURIComponent(this.chatId)}/items`);
    for (const item of data.items || []) this.put(item);
    if (!this.items.size) this.list.append(h("div", { class: "empty", id: "no-items" }, "No messages yet"));
  }

  // The chat's history was deleted: what is shown goes too (the chat itself stays).
  dropItems() {
    this.items.clear();
    clear(this.list, h("div", { class: "empty", id: "no-items" }, "History deleted"));
  }

  async fetchItem(id) {
    if (this.items.has(id) || this.pending.has(id)) return;
    this.pending.add(id);
    try {
      this.put(await get(`/v1/chats/${encodeURIComponent(this.chatId)}/items/${encodeURIComponent(id)}`));
    } catch (e) {
      this.error.textContent = `could not load ${id}: ${e.message}`;
    } finally {
      this.pending.delete(id);
    }
  }

  put(item) {
    if (this.items.has(item.id)) return;
    this.list.querySelector("#no-items")?.remove();
    const el = renderItem(item);
    this.items.set(item.id, el);
    // Keep item order even when fetches finish out of order.
    const after = [...this.list.children].find((c) => c.dataset.itemId && seq(c.dataset.itemId) > seq(item.id));
    const stick = this.list.scrollHeight - this.list.scrollTop - this.list.clientHeight < 80;
    this.list.insertBefore(el, after || null);
    if (stick) this.list.scrollTop = this.list.scrollHeight;
  }

  async loadChains() {
    const data = await get(`${WS}/collaboration`);
    const chains = (data.collaborations || data.items || []).filter((c) => pick(c, "rootChat") === this.chatId);
    renderChains(this.chainList, chains, () => this.loadChains());
  }

  async loadRecords() {
    const id = encodeURIComponent(this.chatId);
    const part = async (label, path, key, card) => {
      try {
        const data = await get(path);
        const rows = data[key] || [];
        return h("details", { open: true }, h("summary", {}, `${label} (${rows.length})`), rows.map(card));
      } catch (e) {
        return h("details", { open: true }, h("summary", {}, label), h("p", { class: "small" }, e.message));
      }
    };
    const jobs = async () => {
      try {
        const data = await get(`${WS}/memory-jobs`);
        const rows = (data.jobs || data.items || []).filter((j) => pick(j, "chat") === this.chatId);
        return h("details", { open: true }, h("summary", {}, `Memory jobs (${rows.length})`), rows.map(jobCard));
      } catch (e) {
        return h("details", {}, h("summary", {}, "Memory jobs"), h("p", { class: "small" }, e.message));
      }
    };
    clear(
      this.records,
      await part("Confessions", `/v1/chats/${id}/confessions`, "confessions", confessionCard),
      await part("Enrichments", `/v1/chats/${id}/enrichments`, "enrichments", enrichmentCard),
      await jobs(),
    );
  }

  onEvent(frame) {
    const d = frame.data || {};
    if (frame.type === "chat.item.created" && d.chat === this.chatId) this.fetchItem(d.item);
    else if (frame.type === "chat.items.deleted" && d.chat === this.chatId) this.dropItems();
    else if (frame.type === "chat.updated" && d.chat === this.chatId && this.project)
      this.project.value = this.chat?.project ?? "";
    else if (frame.type === "collaboration.changed") this.loadChains().catch(() => {});
    else if (frame.type === "request.changed" && d.chat === this.chatId) this.loadRequests().catch(() => {});
    else if (frame.type === "memory.job.changed" && this.records.childElementCount) this.loadRecords().catch(() => {});
  }
}

export function renderItem(item) {
  const kind = item.kind;
  const author = item.author;
  const c = item.communication;
  const el = h("div", { class: "item", testid: "item", data: { kind, itemId: item.id, author: author ?? "" } });
  if (kind === "delivery" && c) {
    // UI-1: the communication record, never the wording, makes this bot-to-bot communication.
    const peerName = c.name || nameOf(c.peer);
    const received = c.direction !== "sent";
    el.append(
      h(
        "div",
        { class: "comm", testid: "communication", data: { direction: c.direction, peer: c.peer } },
        h("span", {}, received ? "message from" : "sent to"),
        avatar(peerName, c.avatar ?? avatarOf(c.peer), 16),
        h("b", {}, peerName),
      ),
      h("div", { class: "text" }, c.body ?? item.text),
    );
    return el;
  }
  if (kind === "notification") {
    el.append(h("div", { class: "text" }, item.text));
    return el;
  }
  const who = nameOf(author);
  el.append(
    h(
      "div",
      { class: "meta" },
      kind === "person" ? null : avatar(who, avatarOf(author), 24),
      h("b", {}, who),
      h("span", {}, time(item.at)),
      kind === "tool_result" || kind === "delivery" ? h("span", { class: "badge" }, kind) : null,
    ),
    h("div", { class: "text" }, item.text),
  );
  return el;
}

// Reasons name people and bots by id ("stopped by u_…"): show the names the console knows.
function named(text) {
  return String(text).replace(/\b[ub]_[A-Za-z0-9_.-]+/g, (id) => nameOf(id));
}

export function renderChains(list, chains, reload) {
  if (!chains.length) {
    clear(list, h("li", { class: "empty" }, "No collaboration chains"));
    return;
  }
  clear(
    list,
    chains.map((c) => {
      const status = c.status;
      const stop = h(
        "button",
        {
          testid: "chain-stop",
          disabled: status !== "running",
          onclick: async (ev) => {
            ev.currentTarget.disabled = true;
            try {
              await post(`${WS}/collaboration/${encodeURIComponent(c.id)}/stop`, {});
            } finally {
              await reload();
            }
          },
        },
        "Stop",
      );
      const links = c.links || [];
      return h(
        "li",
        { class: "card", testid: "chain-entry", data: { chainId: c.id, status } },
        h(
          "div",
          { class: "row" },
          h("span", { class: `badge ${status}`, testid: "chain-status" }, status),
          h("b", {}, nameOf(pick(c, "rootBot"))),
          h("span", { class: "small" }, `${c.deliveries ?? 0} deliveries`),
          stop,
        ),
        c.topic ? h("div", { class: "small" }, `topic ${c.topic}`) : null,
        c.reason ? h("div", { class: "reason", testid: "chain-reason" }, `why: ${named(c.reason)}`) : null,
        links.length
          ? h(
              "ul",
              { class: "links" },
              links.map((l) =>
                h(
                  "li",
                  {},
                  `${nameOf(pick(l, "fromBot"))} → ${nameOf(pick(l, "toBot"))}: ${l.status}`,
                  l.reason ? ` (${named(l.reason)})` : "",
                  l.request ? h("div", { class: "small" }, `asked: ${l.request}`) : null,
                  l.result ? h("div", { class: "small" }, `answer: ${l.result}`) : null,
                  pick(l, "agentChat")
                    ? h("a", { href: `#/chats/${pick(l, "agentChat")}`, class: "small" }, " open agent chat")
                    : null,
                ),
              ),
            )
          : null,
        h("div", { class: "small" }, time(pick(c, "updatedAt"))),
      );
    }),
  );
}

function confessionCard(r) {
  return h(
    "div",
    { class: "card", testid: "confession" },
    h("div", { class: "small" }, `${time(r.at)} · ${r.calm ? "calm answer (no memory model)" : "memory bot"}`),
    h("div", { class: "content" }, `bot: ${r.text}`),
    h("div", { class: "content muted" }, `answer: ${r.answer}`),
  );
}

function enrichmentCard(r) {
  return h(
    "div",
    { class: "card", testid: "enrichment" },
    h("div", { class: "small" }, `${time(r.at)} · used ${(r.entries || []).join(", ") || "no entries"}`),
    h("div", { class: "content muted" }, `said: ${r.original}`),
    h("div", { class: "content" }, `rewritten: ${r.text}`),
  );
}
