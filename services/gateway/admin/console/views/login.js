// Login: the master key, checked by POST /auth and kept in sessionStorage for this tab only.
import { checkMasterKey, masterKey } from "../lib/api.js";
import { h } from "../lib/dom.js";

export async function render(root, { navigate }) {
  const input = h("input", { id: "master-key", name: "master-key", type: "password", autocomplete: "off", required: true, placeholder: "master key" });
  const message = h("p.error", { id: "login-error", role: "alert", hidden: true });
  const form = h("form.login", { id: "login-form" },
    h("h1", "Engram admin"),
    h("p.muted", "The master key (MEMENTO_ACCESS_KEY). It is kept for this tab only and is gone when the tab closes."),
    input,
    h("button.primary", { type: "submit" }, "Log in"),
    message,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    message.hidden = true;
    const key = input.value.trim();
    try {
      if (await checkMasterKey(key)) {
        masterKey.set(key);
        navigate("dashboard");
      } else {
        message.textContent = "That is not the master key.";
        message.hidden = false;
      }
    } catch (error) {
      message.textContent = error.message;
      message.hidden = false;
    }
  });
  root.append(form);
  input.focus();
}
