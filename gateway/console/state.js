// What the signed-in console knows: who it is, the person's chats, channels and bots, and the
// display names of ids it has seen.

export const state = {
  me: null, // {id, name, orgs}
  chats: new Map(),
  channels: [],
  bots: new Map(),
  capabilities: null, // GET /v1/capabilities: {capabilities, unavailable, nodes}
  names: new Map(), // id -> {name, avatar} of bots, people, channels
  view: null,
  stream: null,
};

export function nameOf(id) {
  if (state.me && id === state.me.id) return `${state.me.name} (you)`;
  return state.names.get(id)?.name ?? id;
}

export function avatarOf(id) {
  return state.names.get(id)?.avatar ?? null;
}

export function learn(id, name, av) {
  if (!id) return;
  const known = state.names.get(id) || {};
  state.names.set(id, { name: name || known.name || id, avatar: av ?? known.avatar ?? null });
}
