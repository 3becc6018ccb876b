// A chat's requests (approvals, ENR-3): what the bot proposed, or a person asked for, decided
// once with Approve or Reject; the decision wakes the bot in the chat, whose answer arrives as
// an item. "Ask for approval" opens a request with the composer's text.

import { get, post } from "./api.js";
import { clear, h, time } from "./dom.js";
import { nameOf } from "./state.js";

export async function loadRequests(list, chatId) {
  const data = await get("/v1/requests");
  const mine = (data.requests || []).filter((r) => r.chat === chatId);
  if (!mine.length) {
    clear(list, h("li", { class: "empty" }, "No requests"));
    return;
  }
  clear(
    list,
    mine.map((r) => requestCard(r, () => loadRequests(list, chatId))),
  );
}

// A person's own request in the chat; `bot`: which of a group's bots it wakes (a group's only
// bot when left out).
export function openRequest(chatId, proposal, bot) {
  const body = { proposal };
  if (bot) body.bot = bot;
  return post(`/v1/chats/${encodeURIComponent(chatId)}/requests`, body);
}

function requestCard(r, reload) {
  const decide = (approved) => async (ev) => {
    ev.currentTarget.disabled = true;
    try {
      await post(`/v1/requests/${encodeURIComponent(r.id)}/decision`, { approved });
    } finally {
      await reload();
    }
  };
  const by = r.openedBy ? `asked by ${nameOf(r.openedBy)}` : `proposed by ${nameOf(r.bot)}`;
  return h(
    "li",
    { class: "card", testid: "request-entry", data: { requestId: r.id, status: r.status } },
    h(
      "div",
      { class: "row" },
      h("span", { class: `badge ${r.status}`, testid: "request-status" }, r.status),
      h("b", {}, r.title),
    ),
    h("div", { class: "content" }, r.proposal),
    h("div", { class: "small" }, `${by} · ${time(r.updatedAt)}`),
    r.decidedBy
      ? h("div", { class: "small" }, `${r.status} by ${nameOf(r.decidedBy)}${r.note ? `: ${r.note}` : ""}`)
      : null,
    r.status === "pending"
      ? h(
          "div",
          { class: "row" },
          h("button", { testid: "request-approve", onclick: decide(true) }, "Approve"),
          h("button", { testid: "request-reject", onclick: decide(false) }, "Reject"),
        )
      : null,
  );
}
