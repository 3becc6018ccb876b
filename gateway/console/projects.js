// Projects (WS-7): the person's projects, and one project's
// page with its members, linked channels, memories with each one's revision history, and the
// Markdown export of its memory. Live from project.changed and memory.changed.

import { api, get, post } from "./api.js";
import { clear, h, time } from "./dom.js";
import { nameOf, state } from "./state.js";

const WS = "/api/app/workspace";

function requestId() {
  return `console-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 10)}`;
}

export async function loadProjects() {
  const data = await get(`${WS}/projects`);
  return data.projects || [];
}

function channelName(id) {
  const ch = state.channels.find((c) => c.id === id);
  return ch ? ch.name || (ch.bots || []).map((b) => b.name).join(", ") || id : nameOf(id);
}

export class ProjectsView {
  constructor(main) {
    this.main = main;
  }

  async show() {
    this.list = h("ul", { testid: "project-list" });
    this.name = h("input", { name: "name", placeholder: "project name", required: true });
    this.error = h("div", { class: "error", role: "alert" });
    clear(
      this.main,
      h(
        "div",
        { class: "pane", testid: "projects" },
        h("h1", {}, "Projects"),
        h(
          "form",
          { class: "inline", testid: "project-create", onsubmit: (ev) => this.create(ev) },
          this.name,
          h("button", { class: "primary", type: "submit" }, "Create"),
        ),
        this.error,
        this.list,
      ),
    );
    await this.load();
  }

  refresh() {
    return this.load();
  }

  async load() {
    try {
      const projects = await loadProjects();
      clear(
        this.list,
        projects.length
          ? projects.map((p) =>
              h(
                "li",
                {
                  class: "entry card",
                  testid: "project-entry",
                  data: { projectId: p.id },
                  onclick: () => (location.hash = `#/projects/${encodeURIComponent(p.id)}`),
                },
                h(
                  "div",
                  {},
                  h("div", {}, p.name),
                  h(
                    "div",
                    { class: "sub" },
                    `${p.members.length} member(s) · ${p.channels.length} linked group(s) · revision ${p.revision}`,
                  ),
                ),
              ),
            )
          : h("li", { class: "empty" }, "No projects yet"),
      );
    } catch (e) {
      this.error.textContent = e.message;
    }
  }

  async create(ev) {
    ev.preventDefault();
    const name = this.name.value.trim();
    if (!name) return;
    this.error.textContent = "";
    try {
      await post(`${WS}/projects`, { requestId: requestId(), name });
      this.name.value = "";
    } catch (e) {
      this.error.textContent = e.message;
    }
    await this.load();
  }

  onEvent(frame) {
    if (frame.type === "project.changed") this.load();
  }
}

export class ProjectPage {
  constructor(main, projectId) {
    this.main = main;
    this.projectId = projectId;
    this.open = new Set(); // memories whose history is shown
  }

  async show() {
    this.head = h("div", { class: "row" });
    this.members = h("ul", { testid: "project-members" });
    this.channels = h("ul", { testid: "project-channels" });
    this.memories = h("ul", { testid: "project-memories" });
    this.exported = h("pre", { class: "export hidden", testid: "project-export-text" });
    this.error = h("div", { class: "error", role: "alert" });
    clear(
      this.main,
      h(
        "div",
        { class: "pane", testid: "project-page", data: { projectId: this.projectId } },
        this.head,
        this.error,
        h("h2", {}, "Members"),
        this.members,
        h("h2", {}, "Linked groups"),
        this.channels,
        h("h2", {}, "Memory"),
        this.memories,
        h(
          "h2",
          {},
          "Export ",
          h("button", { testid: "project-export", onclick: () => this.export() }, "Show Markdown"),
        ),
        this.exported,
      ),
    );
    await Promise.all([this.loadProject(), this.loadMemories()]);
  }

  refresh() {
    return Promise.all([this.loadProject(), this.loadMemories()]);
  }

  async loadProject() {
    let project;
    try {
      project = (await loadProjects()).find((p) => p.id === this.projectId);
    } catch (e) {
      this.error.textContent = e.message;
      return;
    }
    if (!project) {
      clear(this.head, h("h1", {}, "Project not found"));
      return;
    }
    clear(
      this.head,
      h("h1", { testid: "project-name" }, project.name),
      h("span", { class: "badge" }, `revision ${project.revision}`),
      h("span", { class: "small" }, `owner ${nameOf(project.owner)} · updated ${time(project.updatedAt)}`),
    );
    clear(
      this.members,
      project.members.map((m) =>
        h("li", { class: "entry", testid: "project-member", data: { userId: m } }, nameOf(m)),
      ),
    );
    clear(
      this.channels,
      project.channels.length
        ? project.channels.map((c) =>
            h("li", { class: "entry", testid: "project-channel", data: { channelId: c } }, channelName(c)),
          )
        : h("li", { class: "empty" }, "No linked groups"),
    );
  }

  async loadMemories() {
    const params = new URLSearchParams({ scope: "project", project: this.projectId, status: "all" });
    let entries;
    try {
      entries = (await get(`${WS}/memories?${params}`)).entries || [];
    } catch (e) {
      this.error.textContent = e.message;
      return;
    }
    clear(
      this.memories,
      entries.length
        ? entries.map((e) => {
            const history = h("ul", { class: "links", testid: "memory-revisions" });
            const card = h(
              "li",
              { class: "card", testid: "project-memory", data: { entryId: e.id, status: e.status } },
              h(
                "div",
                { class: "row" },
                h("span", { class: "badge" }, e.tier),
                e.status !== "active" ? h("span", { class: "badge retracted" }, e.status) : null,
                e.review ? h("span", { class: "badge failed" }, "needs review") : null,
                (e.topics || []).map((t) => h("span", { class: "topic" }, t)),
              ),
              h("div", { class: "content" }, e.content),
              h(
                "div",
                { class: "row small" },
                `from ${nameOf(e.contributor)} · revision ${e.revision} · ${time(e.updatedAt)}`,
                h(
                  "button",
                  { testid: "memory-history", onclick: () => this.toggleHistory(e.id, history) },
                  "History",
                ),
              ),
              history,
            );
            if (this.open.has(e.id)) this.loadHistory(e.id, history);
            return card;
          })
        : h("li", { class: "empty" }, "No project memory yet"),
    );
  }

  toggleHistory(entryId, list) {
    if (this.open.has(entryId)) {
      this.open.delete(entryId);
      clear(list);
      return;
    }
    this.open.add(entryId);
    this.loadHistory(entryId, list);
  }

  async loadHistory(entryId, list) {
    try {
      const data = await get(`${WS}/memories/${encodeURIComponent(entryId)}/revisions`);
      const revisions = data.revisions || [];
      clear(
        list,
        revisions.map((r) =>
          h(
            "li",
            { testid: "memory-revision", data: { revision: r.revision, change: r.change } },
            `${r.revision} · ${r.change} by ${nameOf(r.operator)} · ${time(r.at)}`,
            r.before != null ? h("div", { class: "small" }, `before: ${r.before}`) : null,
            r.after != null ? h("div", {}, `after: ${r.after}`) : null,
          ),
        ),
      );
    } catch (e) {
      clear(list, h("li", { class: "error" }, e.message));
    }
  }

  async export() {
    const params = new URLSearchParams({ scope: "project", project: this.projectId });
    try {
      this.exported.textContent = await api("GET", `${WS}/memory-export?${params}`);
      this.exported.classList.remove("hidden");
    } catch (e) {
      this.error.textContent = e.message;
    }
  }

  onEvent(frame) {
    const d = frame.data || {};
    if (frame.type === "project.changed" && d.project === this.projectId) this.loadProject();
    else if (frame.type === "memory.changed" && d.pool === `project:${this.projectId}`) this.loadMemories();
  }
}
