// A real OAuth 2.1 authorization server for the tests: panva's oidc-provider (an OpenID
// Certified implementation, from npm), configured the way the MCP authorization spec asks of
// one: dynamic client registration, PKCE, resource indicators (RFC 8707) and JWT access
// tokens (RFC 9068) whose audience is the resource. Nothing here is a mock of the protocol;
// only the login page is replaced, by a user who always signs in as AS_ACCOUNT and consents.
//
// Environment:
//   AS_PORT       port on 127.0.0.1
//   AS_ISSUER     issuer identifier (default http://127.0.0.1:AS_PORT)
//   AS_RESOURCES  JSON {"<resource URL>": "<space-separated scopes it offers>"}
//   AS_ACCOUNT    the user who signs in (default alice)
//   AS_GROUPS     comma-separated groups claim of that user's tokens
//   AS_KID        the signing key's id (default k1)
//   OIDC_PROVIDER the oidc-provider package's directory (scripts/setup-test-deps installs it
//                 under target/npm; an ES module resolves imports beside itself, not there)
// A client registered with client_name "short-lived" gets 2-second access tokens.
import http from 'node:http';
import crypto from 'node:crypto';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const { default: Provider, errors } = await import(
  pathToFileURL(path.join(process.env.OIDC_PROVIDER, 'lib', 'index.js')).href
);

const port = Number(process.env.AS_PORT);
const issuer = process.env.AS_ISSUER || `http://127.0.0.1:${port}`;
const resources = JSON.parse(process.env.AS_RESOURCES || '{}');
const account = process.env.AS_ACCOUNT || 'alice';
const groups = (process.env.AS_GROUPS || '').split(',').filter(Boolean);

const { privateKey } = crypto.generateKeyPairSync('rsa', { modulusLength: 2048 });
const signing = { ...privateKey.export({ format: 'jwk' }), kid: process.env.AS_KID || 'k1', alg: 'RS256', use: 'sig' };

const provider = new Provider(issuer, {
  jwks: { keys: [signing] },
  clients: [],
  // The resources' scopes too: a registering client may name them.
  scopes: ['openid', 'offline_access', ...new Set(Object.values(resources).flatMap((s) => s.split(' ')))],
  features: {
    devInteractions: { enabled: false },
    registration: { enabled: true },
    clientCredentials: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: async (_ctx, _client, oneOf) => oneOf,
      useGrantedResource: async () => true,
      getResourceServerInfo: async (_ctx, resource, client) => {
        if (!(resource in resources)) throw new errors.InvalidTarget();
        return {
          scope: resources[resource],
          audience: resource,
          accessTokenFormat: 'jwt',
          accessTokenTTL: client.clientName === 'short-lived' ? 2 : 300,
          jwt: { sign: { alg: 'RS256' } },
        };
      },
    },
  },
  // The user's tokens carry the groups claim; a client's own (client credentials) do not.
  extraTokenClaims: async (_ctx, token) => (token.kind === 'AccessToken' ? { groups } : undefined),
  findAccount: async (_ctx, sub) => ({ accountId: sub, claims: async () => ({ sub }) }),
  interactions: { url: (_ctx, interaction) => `/interaction/${interaction.uid}` },
  pkce: { required: () => true },
  ttl: {
    AccessToken: (_ctx, token) => token.resourceServer?.accessTokenTTL || 300,
    ClientCredentials: (_ctx, token) => token.resourceServer?.accessTokenTTL || 300,
    Grant: 600,
    Interaction: 600,
    Session: 600,
    IdToken: 300,
  },
});

// The user at the login page: signs in as `account`, then grants what the client asked.
async function interaction(req, res) {
  const details = await provider.interactionDetails(req, res);
  const { prompt, params } = details;
  if (prompt.name === 'login') {
    await provider.interactionFinished(req, res, { login: { accountId: account } }, { mergeWithLastSubmission: false });
    return;
  }
  const grant = details.grantId
    ? await provider.Grant.find(details.grantId)
    : new provider.Grant({ accountId: account, clientId: params.client_id });
  const missing = prompt.details;
  if (missing.missingOIDCScope) grant.addOIDCScope(missing.missingOIDCScope.join(' '));
  for (const [indicator, scopes] of Object.entries(missing.missingResourceScopes || {})) {
    grant.addResourceScope(indicator, scopes.join(' '));
  }
  const grantId = await grant.save();
  await provider.interactionFinished(req, res, { consent: { grantId } }, { mergeWithLastSubmission: true });
}

const handler = provider.callback();
http.createServer((req, res) => {
  if (req.url.startsWith('/interaction/')) {
    interaction(req, res).catch((e) => {
      res.statusCode = 500;
      res.end(String(e));
    });
    return;
  }
  handler(req, res);
}).listen(port, '127.0.0.1', () => {
  console.log(`authorization server ${issuer} on 127.0.0.1:${port}`);
});
