// A bot's memory panel (bot memory: layer, topics, who can see each entry; Remember and
// Forget; live from memory.changed) and the workspace view (scoped memory with search, memory
// jobs with their reasons, every collaboration chain).

import { get, post } from "./api.js";
import { renderChains } from "./chat.js";
import { avatar, clear, h, pick, time } from "./dom.js";
import { nameOf, state } from "./state.js";

const WS = "/api/app/workspace";

function topicsOf(tags) {
  return (tags || []).filter((t) => !t.includes(":"));
}

// Who may see an entry, read from its system tags only (ACL-8), in words.
export function audience(tags) {
  const who = [];
  for (const t of tags || []) {
    if (t === "for:bot") who.push("everyone who uses the bot");
    else if (t.startsWith("for:person:")) who.push(nameOf(t.slice("for:person:".length)));
    else if (t.startsWith("for:channel:")) who.push(`group ${nameOf(t.slice("for:channel:".length))}`);
    else if (t.startsWith("for:project:")) who.push(`project ${t.slice("for:project:".length)}`);
  }
  return who.length ? who.join(", ") : "nobody (no access rule)";
}

export class MemoryPanel {
  constructor(main, botId) {
    this.main = main;
    this.botId = botId;
    this.loading = null;
    this.again = false;
  }

  async show() {
    const bot = state.bots.get(this.botId);
    const name = bot?.name || nameOf(this.botId);
    this.list = h("ul", { testid: "memory-list" });
    this.error = h("div", { class: "error", role: "alert" });
    this.node = h("div", { class: "small", testid: "node-status" });
    this.content = h("textarea", { testid: "remember-input", rows: 2, placeholder: "Something to remember" });
    this.topics = h("input", { testid: "remember-topics", placeholder: "topics, comma separated" });
    clear(
      this.main,
      h(
        "div",
        { class: "pane", testid: "memory-panel", data: { botId: this.botId } },
        h(
          "div",
          { class: "row" },
          avatar(name, bot?.avatar, 24),
          h("h1", {}, `${name}: memory`),
          h("a", { testid: "direct-chat", href: `#/bots/${encodeURIComponent(this.botId)}/chat` }, "Chat with this bot"),
        ),
        h(
          "form",
          { class: "inline", onsubmit: (ev) => this.remember(ev) },
          this.content,
          this.topics,
          h("button", { class: "primary", type: "submit", testid: "remember" }, "Remember"),
        ),
        this.node,
        this.error,
        this.list,
      ),
    );
    await Promise.all([this.load(), this.loadNode()]);
  }

  // ND-2, ND-3: where the bot's model runs. Memory is used only on a node that isolates it;
  // otherwise an upgrade hint, and no word of isolation or extraction being on.
  async loadNode() {
    let status;
    try {
      status = await get(`/v1/bots/${encodeURIComponent(this.botId)}/node`);
    } catch (e) {
      clear(this.node, e.message);
      return;
    }
    const node = status.node || {};
    this.node.dataset.memoryInjected = String(Boolean(status.memoryInjected));
    if (status.memoryInjected) {
      clear(
        this.node,
        `Runs on node ${node.id}: memory isolated`,
        status.extraction ? " · background extraction on" : " · no background extraction",
      );
      return;
    }
    clear(
      this.node,
      h(
        "div",
        { class: "hint", testid: "node-upgrade-hint", data: { nodeId: node.id || "" } },
        h("b", {}, "Upgrade hint: "),
        `node ${node.id || "?"}${node.connected === false ? " (not connected)" : ""}: `,
        node.hint ||
          "it does not isolate memory, so this bot chats without its memory. Upgrade it to a node that reports memory isolation.",
      ),
    );
  }

  refresh() {
    return this.load();
  }

  // One read at a time; an event during a read asks for one more read after it.
  async load() {
    if (this.loading) {
      this.again = true;
      return this.loading;
    }
    this.loading = (async () => {
      do {
        this.again = false;
        try {
          const data = await get(`/v1/bots/${encodeURIComponent(this.botId)}/memory`);
          this.render(data.entries || []);
        } catch (e) {
          this.error.textContent = e.message;
        }
      } while (this.again);
    })();
    try {
      await this.loading;
    } finally {
      this.loading = null;
    }
  }

  render(entries) {
    if (!entries.length) {
      clear(this.list, h("li", { class: "empty" }, "Nothing you can see yet"));
      return;
    }
    clear(
      this.list,
      entries.map((e) =>
        h(
          "li",
          {
            class: "card",
            testid: "memory-entry",
            data: { entryId: e.id, layer: e.layer, status: e.status },
          },
          h(
            "div",
            { class: "row" },
            h("span", { class: "badge", testid: "memory-layer" }, e.layer),
            e.status !== "active" ? h("span", { class: `badge ${e.status}` }, e.status) : null,
            pick(e, "invalidatedAt") ? h("span", { class: "badge invalidated" }, "invalidated") : null,
            e.confidence != null ? h("span", { class: "small" }, `confidence ${e.confidence}`) : null,
            topicsOf(e.tags).map((t) => h("span", { class: "topic" }, t)),
          ),
          h("div", { class: "content" }, e.content),
          h("div", { class: "small", testid: "memory-audience" }, `visible to: ${audience(e.tags)}`),
          h(
            "div",
            { class: "row small" },
            `${(e.sources || []).length} source(s) · ${time(pick(e, "updatedAt"))}`,
            e.status === "active"
              ? h("button", { testid: "forget", onclick: () => this.forget(e.id) }, "Forget")
              : null,
          ),
        ),
      ),
    );
  }

  async remember(ev) {
    ev.preventDefault();
    const content = this.content.value.trim();
    if (!content) return;
    const tags = this.topics.value
      .split(",")
      .map((t) => t.trim())
      .filter(Boolean);
    this.error.textContent = "";
    try {
      await post(`/v1/bots/${encodeURIComponent(this.botId)}/memory`, {
        command: { _tag: "Remember", content, tags },
      });
      this.content.value = "";
      this.topics.value = "";
    } catch (e) {
      this.error.textContent = e.message;
    }
    await this.load(); // our own write shows at once; its event reads again, harmlessly
  }

  async forget(id) {
    this.error.textContent = "";
    try {
      await post(`/v1/bots/${encodeURIComponent(this.botId)}/memory`, { command: { _tag: "Forget", id } });
    } catch (e) {
      this.error.textContent = e.message;
    }
    await this.load();
  }

  onEvent(frame) {
    const d = frame.data || {};
    if (frame.type === "memory.changed" && (d.bot === this.botId || d.pool === `bot:${this.botId}`)) this.load();
  }
}

export function jobCard(j) {
  const reasons = pick(j, "rejections", "proposals", "reasons") || [];
  return h(
    "div",
    { class: "card", testid: "memory-job", data: { jobId: j.id, status: j.status } },
    h(
      "div",
      { class: "row" },
      h("span", { class: `badge ${j.status}` }, j.status),
      h("span", { class: "small" }, `${nameOf(String(j.pool || "").replace(/^bot:/, ""))}`),
      h("span", { class: "small" }, `attempts ${j.attempts ?? 0}`),
      h("span", { class: "small" }, time(pick(j, "updatedAt", "createdAt"))),
      j.status === "failed"
        ? h(
            "button",
            {
              testid: "job-retry",
              onclick: async (ev) => {
                ev.currentTarget.disabled = true;
                // The job's memory.job.changed event brings the new status.
                await post(`${WS}/memory-jobs/${encodeURIComponent(j.id)}/retry`, {}).catch(() => {});
              },
            },
            "Retry",
          )
        : null,
    ),
    j.error || j.reason ? h("div", { class: "reason" }, `why: ${j.error || j.reason}`) : null,
    Array.isArray(reasons) && reasons.length
      ? h(
          "ul",
          { class: "links" },
          reasons.map((r) =>
            h("li", {}, typeof r === "string" ? r : `${r.tool || r.kind || r.call || "proposal"}: ${r.reason || r.status || ""}`),
          ),
        )
      : null,
  );
}

// `GET /v1/capabilities`, read once per sign-in (again when `fresh`: nodes come and go).
export async function loadCapabilities(fresh = false) {
  if (!state.capabilities || fresh) {
    const caps = await get("/v1/capabilities");
    state.capabilities = {
      capabilities: caps.capabilities || [],
      unavailable: caps.unavailable || [],
      nodes: caps.nodes || [],
    };
  }
  return state.capabilities;
}

export function offers(capability) {
  return Boolean(state.capabilities?.capabilities.includes(capability));
}

export class WorkspaceView {
  constructor(main) {
    this.main = main;
  }

  async show() {
    this.scope = h(
      "select",
      { testid: "ws-scope" },
      h("option", { value: "" }, "all scopes"),
      ["bot", "user", "project"].map((s) => h("option", { value: s }, s)),
    );
    this.bot = h(
      "select",
      { testid: "ws-bot" },
      h("option", { value: "" }, "any bot"),
      [...state.bots.values()].map((b) => h("option", { value: b.id }, b.name)),
    );
    this.q = h("input", { testid: "ws-search", placeholder: "search memory", type: "search" });
    this.results = h("ul", { testid: "ws-results" });
    this.jobs = h("div", { testid: "memory-jobs" });
    this.chains = h("ul", { testid: "chain-list" });
    this.capabilities = h("div", { testid: "capabilities" });
    this.error = h("div", { class: "error" });
    clear(
      this.main,
      h(
        "div",
        { class: "pane", testid: "workspace" },
        h("h1", {}, "Workspace"),
        h("h2", {}, "Memory"),
        h(
          "form",
          {
            class: "inline",
            onsubmit: (ev) => {
              ev.preventDefault();
              this.search();
            },
          },
          this.scope,
          this.bot,
          this.q,
          h("button", { type: "submit", testid: "ws-search-button" }, "Search"),
        ),
        this.error,
        this.results,
        h("h2", {}, "Memory jobs"),
        this.jobs,
        h("h2", {}, "Collaboration chains"),
        this.chains,
        h("h2", {}, "Server capabilities and execution nodes"),
        this.capabilities,
      ),
    );
    await Promise.all([this.search(), this.loadJobs(), this.loadChains(), this.loadCapabilities()]);
  }

  // ND-1: what the server offers, and each execution node with what it isolates (ND-3: a node
  // that does not isolate gets its upgrade hint, never a claim).
  async loadCapabilities() {
    const caps = await loadCapabilities(true);
    clear(
      this.capabilities,
      h(
        "ul",
        { class: "row", testid: "capability-list" },
        caps.capabilities.map((c) => h("li", { class: "badge live", testid: "capability", data: { capability: c } }, c)),
        caps.unavailable.map((c) =>
          h("li", { class: "badge", testid: "capability", data: { capability: c, unavailable: "true" } }, `${c} (not yet)`),
        ),
      ),
      h(
        "ul",
        { testid: "node-list" },
        caps.nodes.map((n) =>
          h(
            "li",
            { class: "card", testid: "node-entry", data: { nodeId: n.id, isolated: String(Boolean(n.memoryIsolation)) } },
            h("b", {}, n.id),
            n.connected === false ? h("span", { class: "badge failed" }, "not connected") : null,
            " ",
            n.memoryIsolation
              ? `memory isolated${n.memoryExtraction ? " · extraction on" : ""}`
              : h("span", { class: "hint", testid: "node-upgrade-hint" }, n.hint || "Upgrade this node to isolate memory."),
          ),
        ),
      ),
    );
  }

  refresh() {
    return Promise.all([this.search(), this.loadJobs(), this.loadChains()]);
  }

  async search() {
    const params = new URLSearchParams();
    if (this.scope.value) params.set("scope", this.scope.value);
    if (this.bot.value) params.set("bot", this.bot.value);
    if (this.q.value.trim()) params.set("q", this.q.value.trim());
    this.error.textContent = "";
    try {
      const data = await get(`${WS}/memories${params.size ? `?${params}` : ""}`);
      const entries = data.entries || data.items || [];
      clear(
        this.results,
        entries.length
          ? entries.map((e) =>
              h(
                "li",
                { class: "card", testid: "ws-entry", data: { entryId: e.id, scope: e.scope } },
                h(
                  "div",
                  { class: "row" },
                  h("span", { class: "badge" }, e.scope),
                  h("span", { class: "badge" }, e.tier),
                  e.review ? h("span", { class: "badge failed" }, "needs review") : null,
                  e.protected ? h("span", { class: "badge" }, "edited by a person") : null,
                  (e.topics || []).map((t) => h("span", { class: "topic" }, t)),
                ),
                h("div", { class: "content" }, e.content),
                h(
                  "div",
                  { class: "small" },
                  `from ${nameOf(e.contributor)} · ${e.origin ?? ""} · revision ${e.revision} · ${time(pick(e, "updatedAt"))}`,
                ),
              ),
            )
          : h("li", { class: "empty" }, "No entries"),
      );
    } catch (e) {
      this.error.textContent = e.message;
    }
  }

  async loadJobs() {
    try {
      const data = await get(`${WS}/memory-jobs`);
      const jobs = data.jobs || data.items || [];
      clear(this.jobs, jobs.length ? jobs.map(jobCard) : h("div", { class: "empty" }, "No memory jobs"));
    } catch (e) {
      clear(this.jobs, h("div", { class: "error" }, e.message));
    }
  }

  async loadChains() {
    const data = await get(`${WS}/collaboration`);
    renderChains(this.chains, data.collaborations || data.items || [], () => this.loadChains());
  }

  onEvent(frame) {
    if (frame.type === "memory.changed") this.search();
    else if (frame.type === "memory.job.changed") this.loadJobs();
    else if (frame.type === "collaboration.changed") this.loadChains().catch(() => {});
  }
}
