// The console's shell: sign-in, the sidebar (chats, channels, bots), hash routes, and the one
// event stream whose frames each view turns into fetches of what they name.
//   #/chats/<id>          a chat (group or direct): items, composer, chains, records
//   #/bots/<id>/memory    a bot's memory panel
//   #/bots/<id>/chat      opens a direct chat with the bot
//   #/workspace           workspace memory search, memory jobs, every chain, capabilities
//   #/projects            the person's projects (when the server offers bot-projects-v1)
//   #/projects/<id>       a project: members, linked groups, memory with history, export
//   #/admin               the admin view (admin token)

import { AdminView } from "./admin.js";
import { ApiError, get, listAll, post, session } from "./api.js";
import { ChatView } from "./chat.js";
import { avatar, clear, h } from "./dom.js";
import { EventStream } from "./events.js";
import { loadCapabilities, MemoryPanel, offers, WorkspaceView } from "./memory.js";
import { ProjectPage, ProjectsView } from "./projects.js";
import { learn, state } from "./state.js";

const root = document.getElementById("root");
const signinForm = document.getElementById("signin");

function status(text) {
  const el = document.getElementById("live");
  el.textContent = text;
  el.className = `badge ${text === "live" ? "live" : ""}`;
}

async function signIn(token) {
  session.token = token;
  sessionStorage.removeItem("openbot.cursor");
  await start();
}

function signOut() {
  state.stream?.stop();
  state.stream = null;
  session.token = null;
  sessionStorage.removeItem("openbot.cursor");
  location.hash = "";
  location.reload();
}

async function start() {
  let me;
  try {
    me = await get("/v1/me");
  } catch (e) {
    if (e instanceof ApiError && e.status === 403) {
      // Not a user token: the admin token works the admin routes.
      await get("/v1/admin/orgs?limit=1");
      return startAdmin();
    }
    throw e;
  }
  state.me = me;
  learn(me.id, me.name);
  document.getElementById("who").textContent = `${me.name} (${me.id})`;
  // ND-1: features are shown by what the server announces.
  await loadCapabilities().catch(() => {});
  nav([["Workspace", "#/workspace"], ...(offers("bot-projects-v1") ? [["Projects", "#/projects"]] : [])]);
  signinForm.remove();
  clear(
    root,
    h(
      "div",
      { class: "layout", id: "layout" },
      h(
        "aside",
        { class: "sidebar" },
        h("h2", {}, "Chats"),
        h("ul", { testid: "chat-list", id: "chat-list" }),
        h("h2", {}, "Channels"),
        h("ul", { testid: "channel-list", id: "channel-list" }),
        h("h2", {}, "Bots"),
        h("ul", { testid: "bot-list", id: "bot-list" }),
      ),
      h("section", { id: "main", class: "main" }),
    ),
  );
  state.stream = new EventStream(session.token, {
    onEvent: (frame) => onEvent(frame),
    onReset: () => refreshAll(),
    onStatus: status,
    onUnauthorized: signOut,
  });
  state.stream.start();
  window.openbotConsole = { state, drop: () => state.stream?.drop() };
  // Subscribed first, then read: a slow stream only delays the page by a few seconds.
  await Promise.race([state.stream.ready, new Promise((r) => setTimeout(r, 5000))]);
  await loadSidebar();
  window.addEventListener("hashchange", route);
  await route();
}

function startAdmin() {
  document.getElementById("who").textContent = "admin";
  nav([]);
  signinForm.remove();
  state.view = new AdminView(root);
  state.view.show();
}

function nav(links) {
  const el = document.getElementById("nav");
  clear(el, ...links.map(([label, href]) => h("a", { href, testid: `nav-${label.toLowerCase()}` }, label)));
  el.append(h("button", { testid: "sign-out", onclick: signOut }, "Sign out"));
}

async function loadSidebar() {
  const [chats, channels, bots] = await Promise.all([
    listAll("/v1/chats"),
    listAll("/v1/channels"),
    listAll("/v1/bots"),
  ]);
  for (const b of bots) {
    state.bots.set(b.id, b);
    learn(b.id, b.name, b.avatar);
  }
  state.channels = channels;
  for (const ch of channels) {
    learn(ch.id, ch.name || ch.id);
    for (const m of [...(ch.bots || []), ...(ch.people || [])]) learn(m.id, m.name, m.avatar);
  }
  // Every group of the person has its chat in the list: a channel whose chat nobody opened yet
  // gets it now (a channel has exactly one group chat, so this never makes a second).
  const withChat = new Set(chats.filter((c) => c.kind === "group").map((c) => c.channel));
  for (const ch of channels) {
    if (withChat.has(ch.id)) continue;
    try {
      await post("/v1/chats", { channel: ch.id });
    } catch {
      // Shown as a channel only; opening it will say why.
    }
  }
  const all = withChat.size === channels.length ? chats : await listAll("/v1/chats");
  state.chats.clear();
  for (const c of all) addChat(c);
  renderSidebar();
}

function addChat(c) {
  state.chats.set(c.id, c);
  for (const m of [...(c.bots || []), ...(c.people || [])]) learn(m.id, m.name, m.avatar);
}

function renderSidebar() {
  const current = location.hash;
  const chats = [...state.chats.values()].filter((c) => c.kind !== "agent");
  clear(
    document.getElementById("chat-list"),
    chats.length
      ? chats.map((c) =>
          h(
            "li",
            {
              class: `entry ${current === `#/chats/${c.id}` ? "active" : ""}`,
              testid: "chat-entry",
              data: { chatId: c.id, kind: c.kind },
              onclick: () => (location.hash = `#/chats/${c.id}`),
            },
            avatar(c.title, c.bots?.length === 1 ? c.bots[0].avatar : null, 24),
            h("div", {}, h("div", {}, c.title || c.id), h("div", { class: "sub" }, c.kind)),
          ),
        )
      : h("li", { class: "empty" }, "No chats yet"),
  );
  clear(
    document.getElementById("channel-list"),
    state.channels.length
      ? state.channels.map((ch) =>
          h(
            "li",
            {
              class: "entry",
              testid: "channel-entry",
              data: { channelId: ch.id },
              onclick: () => openChannel(ch.id),
            },
            h(
              "div",
              {},
              h("div", {}, ch.name || (ch.bots || []).map((b) => b.name).join(", ") || ch.id),
              h("div", { class: "sub" }, `${ch.mode} · ${(ch.bots || []).map((b) => b.name).join(", ")}`),
            ),
          ),
        )
      : h("li", { class: "empty" }, "No channels"),
  );
  clear(
    document.getElementById("bot-list"),
    state.bots.size
      ? [...state.bots.values()].map((b) =>
          h(
            "li",
            {
              class: `entry ${current.startsWith(`#/bots/${b.id}/`) ? "active" : ""}`,
              testid: "bot-entry",
              data: { botId: b.id },
              onclick: () => (location.hash = `#/bots/${b.id}/memory`),
            },
            avatar(b.name, b.avatar, 24),
            h(
              "div",
              {},
              h("div", {}, b.name),
              h("div", { class: "sub" }, `${b.permission} · ${b.model ?? "no model"}`),
            ),
          ),
        )
      : h("li", { class: "empty" }, "No bots"),
  );
}

async function openChannel(channelId) {
  const chat = await post("/v1/chats", { channel: channelId });
  await reloadChats();
  location.hash = `#/chats/${chat.id}`;
}

async function openDirect(botId) {
  const had = [...state.chats.values()].find((c) => c.kind === "direct" && c.bot === botId);
  const chat = had || (await post("/v1/chats", { bot: botId }));
  if (!had) await reloadChats();
  location.hash = `#/chats/${chat.id}`;
}

async function reloadChats() {
  state.chats.clear();
  for (const c of await listAll("/v1/chats")) addChat(c);
  renderSidebar();
}

async function route() {
  const hash = location.hash || "#/";
  const main = document.getElementById("main");
  const layout = document.getElementById("layout");
  state.view?.close?.();
  state.view = null;
  let m;
  if ((m = hash.match(/^#\/chats\/([^/]+)$/))) {
    const id = decodeURIComponent(m[1]);
    if (!state.chats.has(id)) await reloadChats();
    layout.classList.remove("wide");
    state.view = new ChatView(layout, main, id);
  } else if ((m = hash.match(/^#\/bots\/([^/]+)\/chat$/))) {
    // A direct chat with the bot (the one it has, or a new one), then its address.
    return openDirect(decodeURIComponent(m[1]));
  } else if ((m = hash.match(/^#\/bots\/([^/]+)\/memory$/))) {
    layout.classList.add("wide");
    state.view = new MemoryPanel(main, decodeURIComponent(m[1]));
  } else if (hash === "#/workspace") {
    layout.classList.add("wide");
    state.view = new WorkspaceView(main);
  } else if (hash === "#/projects") {
    layout.classList.add("wide");
    state.view = new ProjectsView(main);
  } else if ((m = hash.match(/^#\/projects\/([^/]+)$/))) {
    layout.classList.add("wide");
    state.view = new ProjectPage(main, decodeURIComponent(m[1]));
  } else {
    layout.classList.add("wide");
    clear(
      main,
      h(
        "div",
        { class: "pane" },
        h("h2", {}, "Welcome"),
        h("p", {}, "Pick a chat, a channel or a bot on the left."),
      ),
    );
  }
  renderSidebar();
  try {
    await state.view?.show();
  } catch (e) {
    main.append(h("p", { class: "error" }, e.message));
  }
}

function onEvent(frame) {
  const d = frame.data || {};
  if (frame.type === "chat.item.created" && d.chat && !state.chats.has(d.chat)) {
    // A chat this person can read that the list does not have yet (a new group, an agent chat).
    reloadChats().catch(() => {});
  }
  if (frame.type === "chat.updated" && state.chats.has(d.chat)) {
    // Changes may be heard out of order: the highest revision wins.
    const chat = state.chats.get(d.chat);
    if ((chat.revision ?? 1) < d.revision) state.chats.set(d.chat, { ...chat, project: d.project, revision: d.revision });
  }
  state.view?.onEvent?.(frame);
}

async function refreshAll() {
  try {
    await state.view?.refresh?.();
  } catch {
    // the view shows its own errors
  }
}

signinForm.addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const err = document.getElementById("signin-error");
  err.textContent = "";
  try {
    await signIn(document.getElementById("token").value.trim());
  } catch (e) {
    session.token = null;
    err.textContent = e instanceof ApiError && e.status === 401 ? "Unknown token" : e.message;
  }
});

if (session.token) {
  start().catch(() => {
    session.token = null;
  });
}
