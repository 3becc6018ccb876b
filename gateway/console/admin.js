// The admin view (admin token): create orgs, users (their token is shown once), bots with a
// model, grants and channels; paged lists of each from /v1/admin/*.

import { ApiError, listAll, post } from "./api.js";
import { clear, h, pick } from "./dom.js";

const field = (label, input) => h("label", { class: "small" }, label, h("br"), input);

function checked(form, name) {
  return [...form.querySelectorAll(`input[name="${name}"]:checked`)].map((i) => i.value);
}

export class AdminView {
  constructor(root) {
    this.root = root;
    this.data = { orgs: [], users: [], bots: [], channels: [] };
  }

  async show() {
    this.error = h("div", { class: "error", role: "alert", testid: "admin-error" });
    this.sections = {};
    for (const key of ["orgs", "users", "bots", "channels"]) this.sections[key] = h("ul", { testid: `admin-${key}` });
    this.forms = h("div", { class: "admin-grid" });
    this.tokenBox = h("div", { testid: "new-token" });
    clear(this.root, h("div", { class: "pane", testid: "admin-view" }, h("h1", {}, "Admin"), this.error, this.forms));
    await this.reload();
  }

  async reload() {
    try {
      const [orgs, users, bots, channels] = await Promise.all(
        ["orgs", "users", "bots", "channels"].map((t) => listAll(`/v1/admin/${t}`)),
      );
      this.data = { orgs, users, bots, channels };
    } catch (e) {
      this.error.textContent = e.message;
    }
    this.render();
  }

  async create(path, body, after) {
    this.error.textContent = "";
    try {
      const made = await post(path, body);
      // Lists and forms are drawn again first, so what `after` shows is never replaced by them.
      await this.reload();
      after?.(made);
      return made;
    } catch (e) {
      this.error.textContent = e instanceof ApiError ? `${e.code || e.status}: ${e.message}` : e.message;
      return null;
    }
  }

  orgSelect(name) {
    return h("select", { name }, this.data.orgs.map((o) => h("option", { value: o.id }, `${o.name} (${o.id})`)));
  }

  render() {
    const { orgs, users, bots, channels } = this.data;
    const token = this.tokenBox;

    const orgForm = h(
      "form",
      {
        testid: "create-org",
        onsubmit: (ev) => {
          ev.preventDefault();
          const f = ev.currentTarget;
          const model = f.botMemoryModel.value.trim();
          this.create("/v1/admin/orgs", {
            name: f.name.value.trim(),
            settings: { botMemory: f.botMemory.checked, botMemoryModel: model || null, autoRecord: f.autoRecord.checked },
          });
        },
      },
      field("Name", h("input", { name: "name", required: true })),
      field("Memory model (botMemoryModel)", h("input", { name: "botMemoryModel", placeholder: "none" })),
      h("label", { class: "small" }, h("input", { type: "checkbox", name: "botMemory", checked: true }), " bot memory"),
      h("label", { class: "small" }, h("input", { type: "checkbox", name: "autoRecord" }), " auto-record"),
      h("button", { class: "primary", type: "submit" }, "Create org"),
    );

    const userForm = h(
      "form",
      {
        testid: "create-user",
        onsubmit: (ev) => {
          ev.preventDefault();
          const f = ev.currentTarget;
          this.create("/v1/admin/users", { name: f.name.value.trim(), orgs: [f.org.value] }, (u) =>
            clear(token, "Token for ", u.name, " (shown once): ", h("div", { class: "token" }, u.token)),
          );
        },
      },
      field("Name", h("input", { name: "name", required: true })),
      field("Org", this.orgSelect("org")),
      h("button", { class: "primary", type: "submit", disabled: !orgs.length }, "Create user"),
    );

    const botForm = h(
      "form",
      {
        testid: "create-bot",
        onsubmit: (ev) => {
          ev.preventDefault();
          const f = ev.currentTarget;
          const body = { name: f.name.value.trim(), org: f.org.value, owner: f.owner.value };
          if (f.model.value.trim()) body.model = f.model.value.trim();
          if (f.avatar.value.trim()) body.avatar = f.avatar.value.trim();
          if (f.prompt.value.trim()) body.rules = { name: body.name, prompt: f.prompt.value.trim() };
          this.create("/v1/admin/bots", body);
        },
      },
      field("Name", h("input", { name: "name", required: true })),
      field("Org", this.orgSelect("org")),
      field("Owner", h("select", { name: "owner" }, users.map((u) => h("option", { value: u.id, data: { orgs: (u.orgs || []).join(" ") } }, `${u.name} (${u.id})`)))),
      field("Model", h("input", { name: "model", placeholder: "a model name from the server config" })),
      field("Avatar", h("input", { name: "avatar", placeholder: "data:image/png;base64,… or /path" })),
      field("Prompt", h("textarea", { name: "prompt", rows: 2 })),
      h("button", { class: "primary", type: "submit", disabled: !users.length }, "Create bot"),
    );

    const grantForm = h(
      "form",
      {
        testid: "create-grant",
        onsubmit: (ev) => {
          ev.preventDefault();
          const f = ev.currentTarget;
          this.create("/v1/admin/grants", { bot: f.bot.value, user: f.user.value, permission: f.permission.value });
        },
      },
      field("Bot", h("select", { name: "bot" }, bots.map((b) => h("option", { value: b.id }, `${b.name} (${b.id})`)))),
      field("User", h("select", { name: "user" }, users.map((u) => h("option", { value: u.id }, `${u.name} (${u.id})`)))),
      field("Permission", h("select", { name: "permission" }, h("option", {}, "read"), h("option", {}, "write"))),
      h("button", { type: "submit", disabled: !bots.length }, "Grant"),
    );

    const channelForm = h(
      "form",
      {
        testid: "create-channel",
        onsubmit: (ev) => {
          ev.preventDefault();
          const f = ev.currentTarget;
          const body = {
            org: f.org.value,
            name: f.name.value.trim(),
            people: checked(f, "people"),
            bots: checked(f, "bots"),
            mode: f.mode.value,
          };
          if (body.mode === "delivery") body.leader = f.leader.value;
          this.create("/v1/admin/channels", body);
        },
      },
      field("Name", h("input", { name: "name" })),
      field("Org", this.orgSelect("org")),
      h("div", { class: "small" }, "People"),
      users.map((u) =>
        h("label", { class: "small", data: { orgs: (u.orgs || []).join(" ") } }, h("input", { type: "checkbox", name: "people", value: u.id }), ` ${u.name} `),
      ),
      h("div", { class: "small" }, "Bots (up to 8)"),
      bots.map((b) =>
        h("label", { class: "small", data: { orgs: b.org } }, h("input", { type: "checkbox", name: "bots", value: b.id }), ` ${b.name} `),
      ),
      field("Mode", h("select", { name: "mode" }, h("option", {}, "discussion"), h("option", {}, "delivery"))),
      field("Leader (delivery)", h("select", { name: "leader" }, bots.map((b) => h("option", { value: b.id, data: { orgs: b.org } }, b.name)))),
      h("button", { class: "primary", type: "submit", disabled: !bots.length }, "Create channel"),
    );

    // Owners, people, bots and leaders offered are those of the org chosen in the same form.
    for (const form of [botForm, channelForm]) {
      const select = form.querySelector('select[name="org"]');
      const filter = () => {
        for (const el of form.querySelectorAll("[data-orgs]")) {
          const fits = el.dataset.orgs.split(" ").includes(select.value);
          el.classList.toggle("hidden", !fits);
          el.hidden = !fits;
          const box = el.querySelector("input");
          if (box && !fits) box.checked = false;
        }
        for (const sel of form.querySelectorAll('select[name="owner"], select[name="leader"]')) {
          const first = [...sel.options].find((o) => !o.hidden);
          if (sel.selectedOptions[0]?.hidden) sel.value = first ? first.value : "";
        }
      };
      select.addEventListener("change", filter);
      filter();
    }
    const row = (text, ...more) => h("li", {}, text, ...more);
    clear(this.sections.orgs, orgs.map((o) => row(`${o.name} · ${o.id} · memory model ${pick(o.settings, "botMemoryModel") ?? "none"}`)));
    clear(this.sections.users, users.map((u) => row(`${u.name} · ${u.id} · ${(u.orgs || []).join(", ")}`)));
    clear(this.sections.bots, bots.map((b) => row(`${b.name} · ${b.id} · model ${b.model ?? "none"} · owner ${b.owner}`)));
    clear(
      this.sections.channels,
      channels.map((c) => row(`${c.name || c.id} · ${c.mode} · ${(c.bots || []).length} bots · ${(c.people || []).length} people`)),
    );
    clear(
      this.forms,
      h("section", {}, h("h2", {}, "Orgs"), orgForm, this.sections.orgs),
      h("section", {}, h("h2", {}, "Users"), userForm, token, this.sections.users),
      h("section", {}, h("h2", {}, "Bots"), botForm, this.sections.bots),
      h("section", {}, h("h2", {}, "Channels"), channelForm, this.sections.channels),
      h("section", {}, h("h2", {}, "Grants"), grantForm),
    );
  }
}
